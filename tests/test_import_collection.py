"""grpo_exp.import_collection: a command's model libraries imported without the cyclic collector, then frozen out of
its sight; the collector restored as it was, and the frozen objects handed back at exit."""

import gc
import subprocess
import sys
import textwrap

from grpo_exp.import_collection import without_collection


def test_within_it_nothing_is_collected_and_after_it_what_exists_is_frozen_and_the_collector_back_on():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with without_collection():
        assert not gc.isenabled()
        made = [[index] for index in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(made)


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
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert ran.stdout.splitlines() == ["frozen: True", "frozen at exit: 0"]
