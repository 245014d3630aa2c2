"""grpo_exp.import_collection: a command's model libraries imported without the cyclic collector, then frozen out of
its sight; the collector restored as it was, and the frozen objects handed back at exit."""

import gc
import subprocess
import sys
import textwrap

from grpo_exp.import_collection import without_collection

FIRST_USE = """
import gc
from grpo_exp.import_collection import without_collection
with without_collection():
    assert not gc.isenabled()
    made = [[index] for index in range(1000)]
assert gc.isenabled() and gc.get_freeze_count() >= len(made)
"""


def run_python(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)


def test_within_it_nothing_is_collected_and_after_its_first_use_what_exists_is_frozen_and_the_collector_back_on():
    run_python(FIRST_USE)  # a process of its own: its first use


def test_a_later_use_freezes_nothing_so_an_earlier_jobs_garbage_is_still_collected():
    """A sweep's second job (Hydra's basic launcher, one process): the first job's trainer, in reference cycles until
    the next collection, must not be frozen for the rest of the process."""
    script = FIRST_USE + textwrap.dedent(
        """
        import weakref
        class Trainer:
            pass
        trainer = Trainer()
        trainer.me = trainer  # a cycle: only the collector frees it
        gone = weakref.ref(trainer)
        del trainer
        with without_collection():
            pass
        gc.collect()
        assert gone() is None
        """
    )
    run_python(script)


def test_a_collector_the_caller_had_turned_off_stays_off():
    gc.disable()
    try:
        with without_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_at_exit_the_frozen_objects_are_handed_back_for_the_interpreters_last_collection():
    script = textwrap.dedent(
        """
        import atexit, gc
        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))  # runs last: registered first
        from grpo_exp.import_collection import without_collection
        with without_collection():
            import json
        print("frozen:", gc.get_freeze_count() > 0)
        """
    )
    ran = run_python(script)
    assert ran.stdout.splitlines() == ["frozen: True", "frozen at exit: 0"]
