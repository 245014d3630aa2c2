"""The names of what a run directory holds, in one place (run lifecycle, resume, sweeps and compare read them)."""

from grpo_exp.paths import FINAL_CHECKPOINT_DIR  # noqa: F401  (in paths: a model setting may name a run dir)

CONFIG_FILE = "config.yaml"  # the resolved config, secrets redacted
METRICS_FILE = "metrics.jsonl"  # every logged step (TRL's metrics and grpo_exp's group statistics)
SAMPLES_FILE = "samples.jsonl"  # whole groups sampled every stats.table_every steps
SUMMARY_FILE = "summary.json"  # written when the run finishes: its presence marks a finished run
ATTEMPT_FILE = "attempt.json"  # what a later attempt needs of this one: W&B run id, held-out accuracy before
STATUS_FILE = "job_status.json"  # a sweep job's status (finished / failed, with its error)
TRAINER_DIR = "trainer"  # TRL's output_dir inside a run directory: its checkpoint-N folders
EVALUATION_FILE = "evaluation.json"  # python -m grpo_exp.evaluate's results
BENCHMARK_FILE = "verification_benchmark.json"  # the verification benchmark's examples this run measured on


def eval_file(when: str) -> str:
    """Each held-out problem's completion and label, before or after training."""
    return f"eval_{when}.jsonl"
