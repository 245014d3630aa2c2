"""A rank of `accelerate launch -m tests.helpers.warm_rank <module> <args>`, started warm (tests/helpers/warm.py):
this client imports only the standard library, hands the warm server its environment and its stdin/stdout/stderr,
forwards the launcher's signals to the rank the server forked, and exits as that rank did. Without a server (or
where the environment differs in what a library reads at import) it becomes `python -m <module> <args>` itself."""

import json
import os
import signal
import socket
import sys

SOCKET_VARIABLE = "GRPO_EXP_TEST_WARM_SOCKET"


def main() -> None:
    module, *args = sys.argv[1:]
    conn = _connect(os.environ.get(SOCKET_VARIABLE))
    if conn is None:
        _cold(module, args)
    request = {
        "module": module,
        "args": args,
        "argv0": module,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k != SOCKET_VARIABLE},
        "unbuffered": sys.stdout.write_through,  # python -u, as torchrun starts its ranks
    }
    rank = None

    def forward(signum, _frame):
        if rank is None:
            os._exit(128 + signum)
        os.killpg(rank, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    reply = json.loads(conn.recv(1 << 16) or b'{"returncode": 1}')
    if reply.get("cold"):
        _cold(module, args)
    rank = reply["pid"]
    code = json.loads(conn.recv(1 << 16) or b'{"returncode": 1}')["returncode"]
    if code < 0:  # it died of a signal: so does this process, as the launcher would have seen it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _connect(path: str | None) -> socket.socket | None:
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def _cold(module: str, args: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


if __name__ == "__main__":
    main()
