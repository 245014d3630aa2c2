"""What the findings read: a run's own records, gathered from its directory (any run grpo_exp made, before the
findings existed too; a file a run did not write is simply absent) or handed over by a live run."""

import math
from dataclasses import dataclass, field
from pathlib import Path

from grpo_exp.run_files import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, eval_file, read_json, read_metrics, read_yaml

PROBE_FILE = "probe.json"


@dataclass
class RunEvidence:
    """`config`: the resolved config (a plain dict); `steps`: each training step's logs (metrics.jsonl's lines with a
    reward); `validations`: the logs of held-out validations (heldout/accuracy); `summary`: summary.json (empty for
    a run that did not finish); `before`/`after`: each held-out problem's answer and label (eval_before/after.jsonl);
    `probe`: the reward probe's findings, one line each (None: it did not run)."""

    config: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    validations: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    before: list[dict] = field(default_factory=list)
    after: list[dict] = field(default_factory=list)
    probe: list[str] | None = None

    def setting(self, dotted: str, default=None):
        """A config value by its dotted key (trainer.num_generations), `default` where the run's config lacks it."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def series(self, key: str) -> list[float]:
        """A metric's finite values over the training steps, in order."""
        values = [step.get(key) for step in self.steps]
        return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]

    @property
    def prompts_per_step(self) -> int:
        return int(self.setting("trainer.prompts_per_step", 1) or 1)

    @property
    def group_size(self) -> int:
        return int(self.setting("trainer.num_generations", 1) or 1)


def is_run_dir(directory: Path) -> bool:
    return (directory / METRICS_FILE).is_file() or (directory / SUMMARY_FILE).is_file()


def read_run(run_dir: Path) -> RunEvidence:
    """Everything a run directory holds that the findings read."""
    config = read_yaml(run_dir / CONFIG_FILE)
    logged = read_metrics(run_dir / METRICS_FILE)
    summary = read_json(run_dir / SUMMARY_FILE)
    return RunEvidence(
        config=config if isinstance(config, dict) else {},
        steps=[line for line in logged if "reward" in line],
        validations=[line for line in logged if isinstance(line.get("heldout/accuracy"), int | float)],
        summary=summary,
        before=read_metrics(run_dir / eval_file("before")),  # one JSON object a line, as metrics.jsonl
        after=read_metrics(run_dir / eval_file("after")),
        probe=_probe_findings(run_dir, summary),
    )


def _probe_findings(run_dir: Path, summary: dict) -> list[str] | None:
    if summary.get("probe_findings") is not None:
        return list(summary["probe_findings"])
    path = run_dir / PROBE_FILE
    if not path.is_file():
        return None
    findings = read_json(path).get("findings", [])
    return [f"{f.get('reward')}: {f.get('attack')} paid {f.get('kind')}" for f in findings if isinstance(f, dict)]
