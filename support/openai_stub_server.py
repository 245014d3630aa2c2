"""A small OpenAI-compatible server for the judge's failure tests: `python support/openai_stub_server.py MODE PORT`.

It speaks real HTTP on 127.0.0.1, so the judge's client code runs unchanged: chat completions (a rubric JSON
reply) and completions (one token, with top logprobs over the score tokens 1..5). Modes:
  good     every reply is rubric JSON / score logprobs (derived from the request, so they differ between responses)
  fail_marked  as good, but a request whose text contains FAIL_ME gets HTTP 500
  garbage  HTTP 200 with a body that is not JSON
  prose    a well-formed completion whose content is not rubric JSON
  flaky    the first request of each distinct prompt fails with HTTP 500, the next succeeds
  slow     replies after 5 seconds (longer than the tests' timeout)
A `latency` environment variable (seconds) delays every reply: the benchmark's network-bound judge.
An `expected_key` environment variable makes it answer 401 to requests without that bearer key.
"""

import hashlib
import json
import math
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def rubric_reply(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    scores = {c: 1 + digest[i] % 5 for i, c in enumerate(("accuracy", "grammar", "informativeness", "coherence"))}
    return json.dumps({**scores, "rationale": "stub"})


def completion(request: dict, text: str) -> dict:
    """One generated token with its top logprobs: the score tokens (weights from the request) and two others."""
    digest = hashlib.sha256(text.encode()).digest()
    weights = {str(score): 1 + digest[score] % 7 for score in range(1, 6)} | {" the": 3, "\n": 1}
    total = sum(weights.values())
    top = {token: math.log(w / total) for token, w in weights.items()}
    best = max(top, key=top.get)
    return {
        "id": "stub",
        "object": "text_completion",
        "created": 0,
        "model": request["model"],
        "choices": [
            {
                "index": 0,
                "text": best,
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [best],
                    "token_logprobs": [top[best]],
                    "top_logprobs": [top],
                    "text_offset": [0],
                },
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class Handler(BaseHTTPRequestHandler):
    # The server's settings, set by main() from its arguments and environment (nothing is read at import).
    mode = "good"
    latency = 0.0
    expected_key: str | None = None
    seen: set[str] = set()  # the prompts answered so far (flaky mode)

    def log_message(self, *args):  # keep the test output quiet
        pass

    def do_POST(self):  # noqa: N802 - http.server's naming
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = request["prompt"] if "prompt" in request else request["messages"][-1]["content"]
        time.sleep(self.latency + (5 if self.mode == "slow" else 0))
        if self.expected_key and self.headers.get("Authorization") != f"Bearer {self.expected_key}":
            return self._send(401, b'{"error": {"message": "bad key"}}')
        if self.mode == "garbage":
            return self._send(200, b"<html>definitely not json")
        if (self.mode == "flaky" and text not in self.seen) or (self.mode == "fail_marked" and "FAIL_ME" in text):
            self.seen.add(text)
            return self._send(500, b'{"error": {"message": "try again"}}')
        if "prompt" in request:
            return self._send(200, json.dumps(completion(request, text)).encode())
        content = "I think it is quite good!" if self.mode == "prose" else rubric_reply(text)
        body = {
            "id": "stub",
            "object": "chat.completion",
            "created": 0,
            "model": request["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        self._send(200, json.dumps(body).encode())

    def _send(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    mode, port = sys.argv[1], int(sys.argv[2])
    Handler.mode = mode
    Handler.latency = float(os.environ.get("latency", "0"))
    Handler.expected_key = os.environ.get("expected_key")
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
