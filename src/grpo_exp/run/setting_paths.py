"""The settings that name local paths: each of the right kind (a file, a directory) before anything loads, saved
absolute in a run's config.yaml, and read back absolute by `grpo-exp evaluate <run dir>` from anywhere. Plain
config reading, no model library: the commands parse their arguments with it before torch loads."""

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpo_exp.deprecated import renamed_config
from grpo_exp.errors import UserError
from grpo_exp.paths import CONF_DIR
from grpo_exp.run_files import CONFIG_FILE, read_yaml
from grpo_exp.schema import DataSource

FILE, DIRECTORY = "a file", "a directory"
LOCAL_DATA = (".jsonl", ".json", ".parquet")  # grpo_exp.data.FILE_BUILDERS
# Settings naming a local path (some may name a hub id, a model option or a URI instead: `_local_path` says when it is
# a path), the kind each must be, and what it names (for the message).
PATH_SETTINGS: dict[str, tuple[str, str]] = {
    "model.name_or_path": (DIRECTORY, "a model directory (with config.json) or a hub id"),
    "model.chat_template": (FILE, "a Jinja template, or a file holding one"),
    "dataset.path": (FILE, "a .jsonl, .json or .parquet file (or a hub dataset)"),
    "dataset.eval_path": (FILE, "a .jsonl, .json or .parquet file"),
    "judge.rubric_file": (FILE, "a YAML file of a rubric"),
    "judge.model": (DIRECTORY, "a model option, a model directory, a grpo_exp run directory or a hub id"),
    "judge.tokenizer": (DIRECTORY, "a model option, a model directory or a hub id"),
    "scorer.model": (DIRECTORY, "initial_policy, a model option, a model directory, a run directory or a hub id"),
    "trainer.resume": (DIRECTORY, "auto, a run directory or a checkpoint directory"),
    "logger.tracking_uri": (DIRECTORY, "a URI or a directory for a local MLflow store"),
    "cache_dir": (DIRECTORY, "the directory materialised models are kept in"),
    "outputs_dir": (DIRECTORY, "the directory run directories go in"),
}
NOT_PATHS = ("auto", "initial_policy")
# Saved absolute when they name an existing path, so that `grpo-exp evaluate <run dir>` reads them from anywhere.
EVALUATION_PATHS = ("model.chat_template", "dataset.path", "dataset.eval_path", "judge.rubric_file", "judge.model")
EVALUATION_PATHS += ("judge.tokenizer", "scorer.model", "logger.tracking_uri", "cache_dir")


def _local_path(key: str, value) -> Path | None:
    """The local path a setting's value names, or None where it names something else (a hub id, a model option, a
    URI, a template's text) or nothing."""
    if not isinstance(value, str) or not value or value in NOT_PATHS or "://" in value or value.startswith("sqlite:"):
        return None
    if key in ("judge.model", "judge.tokenizer", "scorer.model") and (CONF_DIR / "model" / f"{value}.yaml").is_file():
        return None
    if key == "model.chat_template" and ("\n" in value or "{" in value):
        return None
    return Path(value).expanduser()


def check_paths(cfg: DictConfig) -> None:
    """Each path setting that names an existing path names one of its kind (a data file that is a directory, a model
    directory that is a file...); a directory to create must not lie under a file."""
    for key, (kind, names) in PATH_SETTINGS.items():
        path = _local_path(key, OmegaConf.select(cfg, key))
        if path is None:
            continue
        if key == "dataset.path" and path.suffix not in LOCAL_DATA and cfg.dataset.source is DataSource.hub:
            continue  # a hub dataset's id, or a local directory that datasets loads as one
        found = next((p for p in (path, *path.parents) if p.exists()), None)
        if found is None:
            continue
        if found == path:
            if kind is FILE and path.is_dir():
                raise UserError(f"{key}={path}: a directory, where {key} names {names}")
            if kind is DIRECTORY and not path.is_dir():
                raise UserError(f"{key}={path}: a file, where {key} names {names}")
        elif not found.is_dir():
            raise UserError(f"{key}={path}: {found} is a file, so nothing can be under it; {key} names {names}")


def absolute_paths(saved: dict) -> dict:
    """The saved config with each path setting naming an existing local path made absolute (it was read against the
    current directory): a run's config.yaml says which files it read, wherever it is read from."""
    for key in PATH_SETTINGS:
        parent, _, name = key.rpartition(".")
        node = saved.get(parent, {}) if parent else saved
        path = _local_path(key, node.get(name)) if isinstance(node, dict) else None
        if path is not None and (path.exists() or key in ("cache_dir", "outputs_dir")):
            node[name] = os.path.abspath(path)
    return saved


def saved_path_overrides(run_dir: Path) -> list[str]:
    """Overrides giving a run's re-composed config (grpo_exp.evaluate) the absolute paths its config.yaml saved (where
    they still exist), in place of the relative ones of its overrides and config files, which were read against the
    directory the run was started in."""
    saved_file = run_dir / CONFIG_FILE
    saved = read_yaml(saved_file, dict) or {}
    saved = renamed_config(saved)  # an older run's config: its verifier.model is scorer.model
    overrides = []
    for key in EVALUATION_PATHS:
        parent, _, name = key.rpartition(".")
        node = saved.get(parent, {}) if parent else saved
        value = node.get(name) if isinstance(node, dict) else None
        if isinstance(value, str) and os.path.isabs(value) and os.path.exists(value):
            quoted = value.replace("\\", "\\\\").replace("'", "\\'")
            overrides.append(f"{key}='{quoted}'")
    return overrides
