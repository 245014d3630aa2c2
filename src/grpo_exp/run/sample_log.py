"""Where the trainer's sampled groups go: appended to samples.jsonl and, where the run has a tracker, to its table
(grpo_exp.trainer.trainer hands them over as rows; it never touches files or trackers itself)."""

import json
from pathlib import Path

from grpo_exp.run.tracking import Tracker

TABLE_KEY = "groups/samples"


class SampleLog:
    def __init__(self, path: Path, tracker: Tracker):
        self.path, self.tracker = path, tracker

    def write(self, step: int, rows: list[dict]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        self.tracker.log_table(step, TABLE_KEY, rows)
