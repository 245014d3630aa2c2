"""A resumed offline W&B run: its segments read back from their .wandb files, and one `wandb sync` for them all."""

import json
import struct
import zlib
from pathlib import Path

import pytest

from grpo_exp.run.resume import Attempt, explicit_attempt
from grpo_exp.run.wandb_offline import (
    BLOCK_SIZE,
    FIRST,
    FULL,
    LAST,
    MIDDLE,
    RECORD_KEY,
    CorruptLogError,
    find_segments,
    in_order,
    log_chunks,
    logged_twice,
    read_segment,
    segments_so_far,
    sync_command,
)
from tests.helpers.cli import TINY_CLI_RUN, run_cli

# ---- the log format, on hand-made files ------------------------------------------------------------------


def write_log(payloads: list[bytes]) -> bytes:
    """W&B's writer: the header, then each record in chunks that never cross a 32 KiB block."""
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))

    def chunk(kind: int, body: bytes) -> None:
        out.extend(struct.pack("<IHB", zlib.crc32(body, zlib.crc32(bytes([kind]))), len(body), kind) + body)

    for payload in payloads:
        first = True
        while True:
            left = BLOCK_SIZE - len(out) % BLOCK_SIZE
            if left < 7:
                out.extend(b"\0" * left)
                continue
            body, payload = payload[: left - 7], payload[left - 7 :]
            last = not payload
            chunk(FULL if first and last else FIRST if first else LAST if last else MIDDLE, body)
            first = False
            if last:
                break
    return bytes(out)


def test_records_are_read_back_whole_across_blocks():
    payloads = [b"a" * 10, bytes(range(256)) * 300, b"", b"b" * (BLOCK_SIZE - 40), b"c" * 5]  # 76 KiB: 3 blocks
    assert list(log_chunks(write_log(payloads))) == payloads


def test_a_record_cut_off_ends_the_log_and_a_bad_checksum_is_an_error():
    data = write_log([b"first", b"second record"])
    assert list(log_chunks(data[:-3])) == [b"first"]  # killed while writing: the complete records
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptLogError):
        list(log_chunks(bytes(corrupt)))
    with pytest.raises(CorruptLogError):
        list(log_chunks(b"not a log at all"))


# ---- W&B's own offline runs: a run and its resumption ---------------------------------------------------


def offline_attempt(directory: Path, run_id: str, steps: list[int], resume: bool) -> Path:
    """An offline run logging as transformers' WandbCallback does (train/global_step, the charts' x-axis)."""
    import wandb

    directory.mkdir(parents=True)
    run = wandb.init(project="p", id=run_id, dir=str(directory), mode="offline", resume="allow" if resume else None)
    run.define_metric("train/global_step")
    run.define_metric("*", step_metric="train/global_step", step_sync=True)
    for step in steps:
        run.log({"profiling/seconds": 0.1})  # TRL's profiling rows: no train/global_step of their own
        run.log({"train/loss": step / 10, "train/global_step": step})
    run.summary["steps"] = steps[-1]
    run.finish()
    wandb.teardown()  # the service writes the log's records moments after finish(): all of them by its teardown
    [segment] = find_segments(directory, run_id)
    return segment


def test_a_resumed_offline_run_is_a_second_segment_whose_steps_restart(tmp_path):
    first = offline_attempt(tmp_path / "a", "resumeme", [1, 2], resume=False)
    second = offline_attempt(tmp_path / "b", "resumeme", [2, 3], resume=True)  # from checkpoint 1: step 2 again
    a, b = read_segment(first), read_segment(second)

    assert (a.run_id, a.resume, a.exit_code) == ("resumeme", False, 0)
    assert (b.run_id, b.resume, b.exit_code) == ("resumeme", True, 0)  # `wandb sync` appends it to run resumeme
    assert a.start_time < b.start_time
    assert [row.step for row in b.rows] == list(range(len(b.rows)))  # _step restarts at 0: the sync renumbers it
    assert (a.trained_steps, b.trained_steps) == ([1, 2], [2, 3])
    assert logged_twice([a, b]) == [2]
    assert (a.summary["steps"], b.summary["steps"]) == (2, 3)

    assert in_order([second, first, second]) == [first, second]
    just_opened = tmp_path / "c" / "offline-run-20000101_000000-resumeme"  # its run record not written yet
    just_opened.mkdir(parents=True)
    (just_opened / "run-resumeme.wandb").write_bytes(write_log([]))
    assert in_order([just_opened, second, first]) == [first, second, just_opened]
    assert sync_command(in_order([second, first])) == f"wandb sync {first} {second}"
    assert sync_command([]) is None

    # what a resumed attempt's record carries on: the earlier segments, then its own
    earlier = Attempt(tmp_path / "a", False, None, {"wandb_id": "resumeme", RECORD_KEY: [str(first)]})
    assert segments_so_far(earlier, second, "resumeme") == [str(first), str(second)]
    unrecorded = Attempt(tmp_path / "a", False, None, {"wandb_id": "resumeme"})  # found in its run directory
    assert segments_so_far(unrecorded, second, "resumeme") == [str(first), str(second)]
    assert segments_so_far(None, first, None) == [str(first)]


# ---- end to end: a run, and a resumption from its first checkpoint --------------------------------------


@pytest.mark.e2e
def test_training_resumed_offline_appends_to_the_same_wandb_run(tiny_cli_run, tmp_path):
    """The shared tiny run (tests/conftest.py's tiny_cli_run: W&B offline, a checkpoint per step kept), resumed from
    its first checkpoint for a third step. The resumption reads the first attempt's directory, never writes it."""
    first_dir, second_dir = tiny_cli_run.run_dir, tmp_path / "b"
    first_record = (first_dir / "attempt.json").read_text()
    checkpoint = first_dir / "trainer" / "checkpoint-1"
    resume = [f"trainer.resume={checkpoint}", f"hydra.run.dir={second_dir}"]
    second = run_cli(*TINY_CLI_RUN, "trainer.max_steps=3", *resume)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (first_dir / "attempt.json").read_text() == first_record

    run_id = json.loads((first_dir / "attempt.json").read_text())["wandb_id"]
    summary = json.loads((second_dir / "summary.json").read_text())
    assert summary["wandb_id"] == run_id and summary["resumed_from"] == str(checkpoint)
    [first_segment], [second_segment] = find_segments(first_dir, run_id), find_segments(second_dir, run_id)
    a, b = read_segment(first_segment), read_segment(second_segment)
    assert (a.run_id, b.run_id) == (run_id, run_id)
    assert (a.resume, b.resume) == (False, True)
    assert (a.exit_code, b.exit_code) == (0, 0)
    assert b.rows[0].step == 0  # written from 0; `wandb sync` continues it after the first segment's last _step
    assert (a.trained_steps, b.trained_steps) == ([1, 2], [2, 3])
    assert logged_twice([a, b]) == [2]  # trained after checkpoint 1 by both attempts
    assert (a.summary["steps"], b.summary["steps"]) == (2, 3)

    segments = segments_so_far(explicit_attempt(checkpoint), second_segment, run_id)
    assert segments == [str(first_segment), str(second_segment)]
    assert sync_command(segments) == f"wandb sync {first_segment} {second_segment}"
    # what the resumed attempt's summary says to run, and what its record carries on to a later attempt
    assert summary["wandb_sync"] == sync_command(segments)
    assert json.loads((second_dir / "attempt.json").read_text())[RECORD_KEY] == segments
    assert json.loads((first_dir / "attempt.json").read_text())[RECORD_KEY] == [str(first_segment)]
