"""A limit on the CPU time a call spends in this thread, for math-verify's parsing and comparison.

math-verify's own timeouts are signal.alarm's wall clock: on a busy machine (other processes on the cores, a
training step's threads) a right answer whose parse was descheduled for the limit scored 0, so the same completion
could score 1 on one run and 0 on the next. Here the wall-clock alarm re-arms itself for the CPU time the thread has
not yet spent, and expires only once the thread itself has computed for the limit: the score depends on the answer,
not on the machine's load. Signals reach only the main thread, where TRL calls synchronous rewards; elsewhere the
call runs without a limit (the verifier's tail limit still bounds the text).
"""

import signal
import threading
import time
from collections.abc import Callable

# Once the limit is spent, how soon whatever math-verify goes on to (its next comparison) is interrupted too.
AFTER_EXPIRY = 0.05


def call_within_cpu_time(call: Callable[[], object], seconds: float, timed_out: object) -> object:
    """`call()`, or `timed_out` once it has run `seconds` of this thread's CPU time. math-verify's TimeoutException
    is what interrupts it: math-verify itself catches that one (its parse then gives [], its verify False), and
    any that reaches here gives `timed_out`."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    from math_verify.errors import TimeoutException

    deadline = time.thread_time() + seconds

    def expire(signum, frame) -> None:
        left = deadline - time.thread_time()
        if left > 0:  # the wall clock ran while the thread waited for a core: wait for the CPU time still unspent
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        # math-verify catches this per comparison and goes on to the next: each is cut short in turn.
        signal.setitimer(signal.ITIMER_REAL, AFTER_EXPIRY)
        raise TimeoutException(f"ran past {seconds} s of CPU time")

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutException:
        return timed_out
    finally:
        signal.signal(signal.SIGALRM, previous)
