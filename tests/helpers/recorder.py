"""Compare the torch.distributed calls each rank made (written by tests.helpers.recorded_run)."""

import json
from pathlib import Path


def read_records(record_dir: Path) -> dict[int, list[dict]]:
    """Each rank's calls, in order."""
    return {
        int(path.stem.removeprefix("rank")): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(record_dir.glob("rank*.jsonl"))
    }


def mismatch(records: dict[int, list[dict]], allow_early_end: bool = False) -> str | None:
    """None when every rank made the same calls, from the same places, in the same order; else where they first
    differ, named (the same call from two places pairs data that does not belong together).

    allow_early_end: a rank that stopped early (it failed) only has to agree with the others up to where it stopped.
    """
    if len(records) < 2:
        return f"records of {len(records)} rank(s): nothing to compare"
    ranks = sorted(records)
    reference = records[ranks[0]]
    for rank in ranks[1:]:
        calls = records[rank]
        for index, (mine, theirs) in enumerate(zip(reference, calls, strict=False)):
            if mine != theirs:
                return (
                    f"call {index}: rank {ranks[0]} made {mine['call']} (at {mine['site']}), "
                    f"rank {rank} made {theirs['call']} (at {theirs['site']})"
                )
        if len(reference) != len(calls) and not allow_early_end:
            longer, extra = (ranks[0], reference) if len(reference) > len(calls) else (rank, calls)
            first = extra[min(len(reference), len(calls))]
            return (
                f"rank {ranks[0]} made {len(reference)} calls, rank {rank} {len(calls)}: rank {longer} went on with "
                f"{first['call']} (at {first['site']})"
            )
    return None
