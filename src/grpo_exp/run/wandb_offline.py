"""An offline W&B run continued by trainer.resume: its segments, what each holds, and the one `wandb sync` command
that uploads them as one run.

Each attempt at a run opens W&B with the same run id and writes its own directory, `<run dir>/wandb/offline-run-
<time>-<id>/`, holding a `run-<id>.wandb` transaction log. A resumed attempt's run record says `resume` (W&B 0.31 and
later), and `wandb sync` then appends its history after the run's last `_step` on the server (its `_step` restarts
at 0 in the file: the sync renumbers it). An attempt synced before the one it resumes, or alone, loses history: the
run needs every segment, in the order they were written. `wandb sync` orders the files of one run by their start
time, so one command naming them all is safe (README: "Resuming an offline W&B run"). Steps trained again after
resuming from a checkpoint older than the last logged step are in two segments, so twice in the synced run.

The reader below is W&B's log format, read without W&B's internals (wandb 0.31 ships no Python reader): a 7-byte
header, then LevelDB log blocks of 32 KiB whose chunks (CRC-32, length, type) carry serialized `Record` messages.
"""

import json
import shlex
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_exp.run.resume import Attempt

HEADER = struct.Struct("<4sHB")  # ident, magic, version
IDENT, MAGIC = b":W&B", 0xBEE1
CHUNK = struct.Struct("<IHB")  # CRC-32 of type byte + data, data length, type
BLOCK_SIZE = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
STEP_METRIC = "train/global_step"  # transformers' WandbCallback: the x-axis of every chart (define_metric)
TRAIN_METRIC = "train/loss"  # in the rows of optimisation steps only (not in profiling, histogram or table rows)
RECORD_KEY = "wandb_offline_dirs"  # attempt.json: this run's offline segments so far, oldest first


class CorruptLogError(ValueError):
    pass


def log_chunks(data: bytes) -> Iterator[bytes]:
    """The records' bytes in a .wandb file's contents. A record cut off at the end (a run killed while writing)
    ends the iteration; a chunk whose checksum does not match raises CorruptLogError."""
    if len(data) < HEADER.size:
        return
    ident, magic, version = HEADER.unpack_from(data)
    if ident != IDENT or magic != MAGIC or version != 0:
        raise CorruptLogError(f"not a W&B transaction log (header {data[: HEADER.size]!r})")
    position, pending = HEADER.size, b""
    while position + CHUNK.size <= len(data):
        left_in_block = BLOCK_SIZE - position % BLOCK_SIZE
        if left_in_block < CHUNK.size:  # the writer pads a block's tail that cannot hold a chunk header
            position += left_in_block
            continue
        checksum, length, kind = CHUNK.unpack_from(data, position)
        if (checksum, length, kind) == (0, 0, 0):  # zero padding
            position += left_in_block
            continue
        start = position + CHUNK.size
        body = data[start : start + length]
        if len(body) < length:
            return
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != checksum:
            raise CorruptLogError(f"checksum mismatch at byte {position}")
        position = start + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            yield pending + body
            pending = b""
        else:
            raise CorruptLogError(f"unknown chunk type {kind} at byte {position}")


def records(path: Path) -> Iterator[Any]:
    """The `wandb_internal_pb2.Record` messages of a .wandb file, in the order they were written."""
    from wandb.proto import wandb_internal_pb2  # wandb imports slowly: only when a file is read

    for raw in log_chunks(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


@dataclass(frozen=True)
class HistoryRow:
    step: int  # `_step`, as written (a resumed attempt's restart at 0: `wandb sync` renumbers them)
    global_step: int | None  # the trainer's step the row belongs to (train/global_step)
    values: dict[str, Any]


@dataclass
class Segment:
    """One attempt's offline run directory, read back."""

    directory: Path
    run_id: str
    resume: bool  # the run record's `resume`: `wandb sync` appends it to the run of that id
    start_time: float | None  # seconds since the epoch; None: no run record yet (written moments after it opens)
    rows: list[HistoryRow] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None  # None: the attempt never finished its W&B run (killed)

    @property
    def trained_steps(self) -> list[int]:
        """The trainer steps this attempt logged training metrics for."""
        return [row.global_step for row in self.rows if TRAIN_METRIC in row.values and row.global_step is not None]


def wandb_file(directory: Path) -> Path:
    """The transaction log of an offline run directory (`run-<id>.wandb`)."""
    found = sorted(Path(directory).glob("run-*.wandb"))
    if not found:
        raise FileNotFoundError(f"no run-*.wandb file in {directory}")
    return found[0]


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_segment(directory: Path) -> Segment:
    directory = Path(directory)
    segment = Segment(directory, run_id="", resume=False, start_time=None)
    for record in records(wandb_file(directory)):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            segment.run_id, segment.resume = run.run_id, bool(run.resume)
            segment.start_time = run.start_time.seconds + run.start_time.nanos / 1e9
        elif kind == "history":
            values = {_key(item): json.loads(item.value_json) for item in record.history.item}
            step = values.get("_step", record.history.step.num)
            global_step = values.get(STEP_METRIC)
            segment.rows.append(HistoryRow(int(step), None if global_step is None else int(global_step), values))
        elif kind == "summary":
            for item in record.summary.update:
                segment.summary[_key(item)] = json.loads(item.value_json)
            for item in record.summary.remove:
                segment.summary.pop(_key(item), None)
        elif kind == "exit":
            segment.exit_code = record.exit.exit_code
    return segment


def in_order(directories: Iterable[Path]) -> list[Path]:
    """The offline run directories, each once, oldest first (by the start time their run record holds; those
    without a readable one last, by name: it begins with the time the attempt opened the run)."""
    unique: dict[Path, Path] = {}
    for directory in directories:
        unique.setdefault(Path(directory).resolve(), Path(directory))

    def started(directory: Path) -> tuple[float, str]:
        try:
            start_time = read_segment(directory).start_time
        except (OSError, ValueError):
            start_time = None
        return float("inf") if start_time is None else start_time, directory.name

    return sorted(unique.values(), key=started)


def find_segments(run_dir: Path, run_id: str) -> list[Path]:
    """The offline segments of W&B run `run_id` a run directory holds (more than one when an attempt was requeued
    into the directory it had)."""
    return [d for d in sorted((Path(run_dir) / "wandb").glob(f"offline-run-*-{run_id}")) if any(d.glob("*.wandb"))]


def segments_so_far(attempt: Attempt | None, current: Path | None, run_id: str | None) -> list[str]:
    """This run's offline segments, oldest first: the earlier attempts' (the earlier attempt's record lists them;
    for an attempt from before the records kept them, those in its run directory), then this attempt's own, last
    (None: it is not offline)."""
    earlier: list[Path] = []
    if attempt is not None and run_id:
        recorded = attempt.record.get(RECORD_KEY)
        earlier = [Path(d) for d in recorded] if recorded is not None else find_segments(attempt.run_dir, run_id)
    if current is not None:  # requeued into its own run directory, it finds its own segment there too
        earlier = [d for d in earlier if d.resolve() != Path(current).resolve()]
    ordered = in_order(d for d in earlier if d.is_dir())
    return [str(d) for d in [*ordered, *([current] if current is not None else [])]]


def sync_command(directories: list[str] | list[Path]) -> str | None:
    """One `wandb sync` for every segment of the run, oldest first (the order `wandb sync` also uploads them in)."""
    if not directories:
        return None
    return "wandb sync " + " ".join(shlex.quote(str(d)) for d in directories)


def logged_twice(segments: list[Segment]) -> list[int]:
    """Trainer steps whose training metrics more than one segment holds: steps trained again after resuming from a
    checkpoint older than the last logged step. Synced, the run has a row for each (two points at that x)."""
    seen: dict[int, int] = {}
    for segment in segments:
        for step in set(segment.trained_steps):
            seen[step] = seen.get(step, 0) + 1
    return sorted(step for step, count in seen.items() if count > 1)
