"""The names of what a run directory holds, in one place (run lifecycle, resume, sweeps and compare read them), and
the readers of its JSON and YAML files."""

import json
import os
import tempfile
from pathlib import Path

import yaml

from grpo_exp.errors import DamagedFile, UserError
from grpo_exp.paths import FINAL_CHECKPOINT_DIR  # noqa: F401  (in paths: a model setting may name a run dir)

HELDOUT_ACCURACY = "heldout/accuracy"  # the metric validations log and checkpoint-best goes by, by default

CONFIG_FILE = "config.yaml"  # the resolved config, secrets redacted
METRICS_FILE = "metrics.jsonl"  # every logged step (TRL's metrics and grpo_exp's group statistics)
SAMPLES_FILE = "samples.jsonl"  # whole groups sampled every stats.table_every steps
SUMMARY_FILE = "summary.json"  # written when the run finishes: its presence marks a finished run
ATTEMPT_FILE = "attempt.json"  # what a later attempt needs of this one: W&B run id, held-out accuracy before
STATUS_FILE = "job_status.json"  # a sweep job's status (finished / failed, with its error)
TRAINER_DIR = "trainer"  # TRL's output_dir inside a run directory: its checkpoint-N folders
WARMUP_DIR = "warmup"  # the warm-up stage's (warmup=sft): SFTTrainer's checkpoints, metrics, the warmed model
WARMUP_SUMMARY = "warmup/summary.json"  # written when the warm-up ends: its presence marks a finished warm-up
EVALUATION_FILE = "evaluation.json"  # python -m grpo_exp.evaluate's results (a later one: evaluation_2.json, ...)
BENCHMARK_FILE = "verification_benchmark.json"  # the verification benchmark's examples this run measured on


# Seconds generation ahead spends at the start of a step, before TRL's step_time starts (transformers draws the step's
# batches there): the weight sync and the wait for the requests in flight before it (grpo_exp.trainer.async_generation)
BEFORE_STEP_SECONDS = "async/before_step_seconds"


def step_seconds(record: dict) -> float | None:
    """A logged step's training time: TRL's step_time, and what generation ahead did before it (None: no step_time,
    not a training step's record)."""
    if "step_time" not in record:
        return None
    return record["step_time"] + record.get(BEFORE_STEP_SECONDS, 0.0)


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (metrics.jsonl, samples.jsonl, eval_*.jsonl), [] where it is absent. A last
    line that is not JSON is the one a process was stopped while writing (killed, out of time or disk): left out, so
    that a run cut short can still be resumed, compared and diagnosed. A damaged line before it, or a line that is
    not an object, is a DamagedFile naming the file and the line."""
    if not path.is_file():
        return []
    lines = read_text(path).splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            if number == len(lines):  # cut short as it was written
                break
            raise DamagedFile(f"{path}: line {number} is not JSON ({err})") from None
        if not isinstance(record, dict):
            raise DamagedFile(f"{path}: line {number} is not a JSON object")
        records.append(record)
    return records


def read_json(path: Path) -> dict:
    """A JSON object from a file (summary.json, job_status.json, probe.json), {} where it is absent; a file that is
    not a JSON object is a DamagedFile naming it."""
    if not path.is_file():
        return {}
    try:
        record = json.loads(read_text(path))
    except ValueError as err:
        raise DamagedFile(f"{path}: not JSON ({err})") from None
    if not isinstance(record, dict):
        raise DamagedFile(f"{path}: not a JSON object")
    return record


def read_yaml(path: Path, expected: type | None = None):
    """A YAML file's content (config.yaml, .hydra/overrides.yaml), None where it is absent or empty; a file that is
    not YAML, or whose content is not of the `expected` type (a dict, a list), is a DamagedFile naming it."""
    if not path.is_file():
        return None
    try:
        content = yaml.safe_load(read_text(path))
    except yaml.YAMLError as err:
        raise DamagedFile(f"{path}: not YAML ({' '.join(str(err).split())})") from None
    if expected is not None and content is not None and not isinstance(content, expected):
        what = {dict: "a mapping", list: "a list"}.get(expected, expected.__name__)
        raise DamagedFile(f"{path}: not {what} (it holds a {type(content).__name__})")
    return content


def read_text(path: Path) -> str:
    """A text file a user or a run directory provides; one that cannot be read is a DamagedFile naming it and why
    (bytes that are not UTF-8 are replaced, not refused: the parsers say what they make of them)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise DamagedFile(f"{path}: cannot be read ({err.strerror or err})") from None


def not_directories(paths: list[Path]) -> str | None:
    """Why some of `paths` cannot hold runs ("x: no such directory; y.txt: not a directory"), None when all are
    directories (what grpo-exp compare and diagnose are given)."""
    problems = [f"{p}: {'not a directory' if p.exists() else 'no such directory'}" for p in paths if not p.is_dir()]
    return "; ".join(problems) or None


def output_directory_problem(path: Path) -> str | None:
    """Why `path` cannot take a command's output (a file is there, a parent is a file, the operating system refuses
    to create it: no permission, a read-only or special file system), None where it can: checked before any work, so
    that nothing is computed and then lost. Tried, not inferred from permission bits (which say yes to root, and
    nothing of /sys or a read-only mount): a directory made in the nearest one that exists, removed at once."""
    if path.exists() and not path.is_dir():
        return "a file is there, not a directory"
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot be created ({existing} is a file)"
    try:  # a directory, and a file in it: some file systems make the one and refuse the other (a cgroup's: EACCES)
        made = tempfile.mkdtemp(prefix=".grpo_exp-write-check-", dir=existing)
        try:
            with tempfile.TemporaryFile(dir=made):
                pass
        finally:
            os.rmdir(made)
    except OSError as err:
        where = "cannot be written" if existing == path.absolute() else f"cannot be created in {existing}"
        return f"{where} ({err.strerror or err})"
    return None


def check_output_directories(directories: dict[str, Path]) -> None:
    """Refuses, before any work, the output directories that cannot be created or written: one UserError naming
    each one's setting (`directories`: the setting as the user wrote it, e.g. "outputs_dir=/sys/out", -> the
    directory the command writes to, which may lie below it)."""
    problems = []
    for setting, path in directories.items():
        if problem := output_directory_problem(path):
            below = "" if setting.endswith(str(path)) else f" ({path})"
            problems.append(f"{setting}{below}: {problem}")
    if problems:
        raise UserError("; ".join(problems) + ": give a directory this user can write to")


def check_command_outputs(cfg, out_dir: Path, run_dir_given: bool) -> None:
    """grpo-exp evaluate's and probe's directories, before any model loads: their output directory (the run directory
    they were given, or one under outputs_dir) and cache_dir."""
    where = f"the run directory {out_dir}" if run_dir_given else f"outputs_dir={cfg.outputs_dir}"
    check_output_directories({where: out_dir, f"cache_dir={cfg.cache_dir}": Path(cfg.cache_dir)})


def new_evaluation_files(directory: Path) -> tuple[Path, Path]:
    """Where the next `python -m grpo_exp.evaluate` of `directory` writes: evaluation.json, else evaluation_2.json,
    ... (an earlier evaluation is never overwritten), and beside it each problem's answers (.jsonl)."""
    number = 1
    while (path := directory / _numbered(number)).exists():
        number += 1
    return path, path.with_suffix(".jsonl")


def latest_evaluation(directory: Path) -> Path | None:
    """The last evaluation written in `directory` (new_evaluation_files), None when there is none."""
    number = 1
    while (directory / _numbered(number + 1)).exists():
        number += 1
    path = directory / _numbered(number)
    return path if path.exists() else None


def _numbered(number: int) -> str:
    stem, suffix = EVALUATION_FILE.rsplit(".", 1)
    return EVALUATION_FILE if number == 1 else f"{stem}_{number}.{suffix}"


def eval_file(when: str) -> str:
    """Each held-out problem's completion and label, before or after training."""
    return f"eval_{when}.jsonl"


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's records (read_jsonl: a last line cut short is left out)."""
    return read_jsonl(path)
