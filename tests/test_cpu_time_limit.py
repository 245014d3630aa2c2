"""The math verifier's limit counts the CPU time its own thread spends, not the wall clock: a busy machine does not
turn a right answer into 0, and work past the limit is still cut off (the adversarial answers: test_rewards)."""

import signal
import subprocess
import sys
import threading
import time

from math_verify.errors import TimeoutException

from grpo_exp.verification.cpu_time_limit import call_within_cpu_time


def spin(seconds: float) -> None:
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


def test_time_the_thread_spends_waiting_does_not_count():
    def waits_then_computes():
        time.sleep(0.6)  # the wall clock runs past the limit; the thread's CPU time does not
        spin(0.05)
        return "answered"

    started = time.perf_counter()
    assert call_within_cpu_time(waits_then_computes, 0.3, timed_out="cut off") == "answered"
    assert time.perf_counter() - started >= 0.6


def test_computing_past_the_limit_is_cut_off_soon_after_it():
    started = time.thread_time()
    assert call_within_cpu_time(lambda: spin(30), 0.3, timed_out="cut off") == "cut off"
    assert 0.3 <= time.thread_time() - started < 2


def test_work_that_catches_the_timeout_and_goes_on_is_cut_off_again():
    """As math-verify's verify does: each comparison catches the timeout, and the next one starts."""
    caught = []

    def comparisons():
        for _ in range(5):
            try:
                spin(30)
            except TimeoutException:
                caught.append(time.thread_time())
        return "all compared"

    started = time.thread_time()
    assert call_within_cpu_time(comparisons, 0.2, timed_out="cut off") == "all compared"
    assert len(caught) == 5 and caught[-1] - started < 2


def test_the_previous_alarm_handler_comes_back_and_no_alarm_is_left():
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        assert call_within_cpu_time(lambda: 7, 1, timed_out=None) == 7
        assert call_within_cpu_time(lambda: spin(30), 0.1, timed_out=None) is None
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_off_the_main_thread_it_runs_without_a_limit():
    results = []
    worker = threading.Thread(target=lambda: results.append(call_within_cpu_time(lambda: spin(0.3), 0.1, "cut off")))
    worker.start()
    worker.join()
    assert results == [None]


def test_a_right_answer_scores_1_when_the_machine_takes_the_core_away_past_the_limit():
    """In a fresh process, the parse of a closed form (math-verify's extraction) is stopped for 2.5 s (SIGSTOP, as a
    busy machine deschedules it), past the 2 s limit: math-verify's wall-clock alarm scored that right answer 0."""
    script = """
import os, signal, subprocess
from math_verify import parser
from grpo_exp.verification import rule

extract = parser.extract_target_from_pred

def descheduled_extraction(*args, **kwargs):
    parser.extract_target_from_pred = extract  # once: the first parse (the reference's)
    subprocess.Popen(["sh", "-c", f"sleep 2.5; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    return extract(*args, **kwargs)

parser.extract_target_from_pred = descheduled_extraction
print(rule.answer_score("\\\\boxed{1 + \\\\sqrt{2}}", "$1+\\\\sqrt{2}$"))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1.0"]
