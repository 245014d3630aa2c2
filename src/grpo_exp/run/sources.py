"""What a command (grpo_exp.evaluate, grpo-exp probe) composes: a run directory (its config re-composed from its
overrides and config directories, its checkpoint in place of its model), a checkpoint, or a plain model config, with
the command's own arguments (--config-dir)."""

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir

from grpo_exp.deprecated import translate_overrides
from grpo_exp.errors import DamagedFile, UserError
from grpo_exp.paths import CONF_DIR
from grpo_exp.plugins import ensure_cwd_importable
from grpo_exp.run.kept_models import BEST_CHECKPOINT_DIR, TOP_CHECKPOINTS_DIR
from grpo_exp.run.setting_paths import saved_path_overrides
from grpo_exp.run_files import FINAL_CHECKPOINT_DIR, read_yaml


@dataclass
class Source:
    """What to compose: the Hydra overrides, the config directories beyond conf/ ((provider, url) as Hydra's search
    path holds them, in order), where results go (None: a new directory under outputs_dir) and the run's working
    directory (its modules import from there too)."""

    overrides: list[str]
    out_dir: Path | None = None
    config_sources: list[tuple[str, str]] = field(default_factory=list)
    run_cwd: str | None = None


def command_args(argv: list[str], prog: str, doc: str, epilog: str, metavar: str) -> tuple[list[str], list[str]]:
    """A command's (run directory or overrides, --config-dir directories), as evaluate and probe take them; `doc`:
    the command's module docstring (its first line describes it)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n", 1)[0].strip("`").split(": ", 1)[-1],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("args", nargs="*", metavar=metavar)
    parser.add_argument(
        "--config-dir",
        "-cd",
        action="append",
        default=[],
        metavar="DIR",
        help="a config directory of yours (reward/, dataset/, experiment/ ...), searched as by grpo-exp train",
    )
    parsed = parser.parse_intermixed_args(argv)
    return parsed.args, parsed.config_dir


def resolve_source(argv: list[str], config_dirs: list[str] | None = None) -> Source:
    """What to compose for a run directory, a checkpoint, or a plain model config."""
    explicit = [("command-line", f"file://{_config_dir(d)}") for d in config_dirs or []]
    if not argv or "=" in argv[0]:
        return Source(translate_overrides(argv), None, explicit)
    source, overrides = Path(argv[0]), translate_overrides(argv[1:])
    run_dir, checkpoint = source, source / FINAL_CHECKPOINT_DIR
    if source.name in (FINAL_CHECKPOINT_DIR, BEST_CHECKPOINT_DIR) and (source.parent / ".hydra").is_dir():
        run_dir, checkpoint = source.parent, source  # a run's own checkpoint: evaluated with the run's config
    elif source.parent.name == TOP_CHECKPOINTS_DIR and (source.parent.parent / ".hydra").is_dir():
        run_dir, checkpoint = source.parent.parent, source  # a runner-up kept by eval.keep_top_k
    run_sources, run_cwd = [], None
    if (run_dir / ".hydra" / "overrides.yaml").is_file() and checkpoint.is_dir():
        # Re-compose the run's own config (its overrides, its config directories), then point the model at the
        # checkpoint.
        overrides_file = run_dir / ".hydra" / "overrides.yaml"
        run_overrides = read_yaml(overrides_file, list) or []
        if not all(isinstance(o, str) for o in run_overrides):
            raise DamagedFile(f"{overrides_file}: not a list of overrides (key=value strings)")
        kept = [o for o in run_overrides if not o.lstrip("+~").startswith("hydra.")]
        kept = translate_overrides(kept, f"{run_dir / '.hydra' / 'overrides.yaml'}")  # an older run's names
        kept += saved_path_overrides(run_dir)  # its relative paths were read against the run's directory
        run_sources, run_cwd = run_config_sources(run_dir)
    elif (source / "config.json").is_file():
        checkpoint, kept = source, []
    else:
        raise UserError(
            f"{source}: not a grpo_exp run directory (with {FINAL_CHECKPOINT_DIR}/) nor a model checkpoint "
            "(with config.json); see --help"
        )
    model = ["model.source=pretrained", f"model.name_or_path={checkpoint.resolve()}", "model.lora.enabled=false"]
    sources = explicit + [s for s in run_sources if s not in explicit]
    return Source(kept + model + overrides, source, sources, run_cwd)


def _config_dir(path: str) -> Path:
    directory = Path(path).expanduser().resolve()
    if not directory.is_dir():
        raise UserError(f"--config-dir {path}: no such directory")
    return directory


# The search path's own entries (Hydra's, conf/, grpo_exp's mixes, the structured schema): not the run's additions.
BUILT_IN_PROVIDERS = ("hydra", "main", "schema")
BUILT_IN_SCHEMES = ("structured", "grpo-exp")


def run_config_sources(run_dir: Path) -> tuple[list[tuple[str, str]], str | None]:
    """The config directories a run was composed from beyond conf/ (its --config-dir and hydra.searchpath entries,
    in the order of its search path; a relative one is relative to the run's working directory), and that working
    directory: from <run dir>/.hydra/hydra.yaml."""
    saved = run_dir / ".hydra" / "hydra.yaml"
    if not saved.is_file():
        return [], None
    runtime = hydra_runtime(saved)
    cwd = runtime.get("cwd")
    sources = []
    for entry in runtime.get("config_sources") or []:
        scheme, path = entry.get("schema"), str(entry.get("path") or "")
        if scheme in BUILT_IN_SCHEMES or entry.get("provider") in BUILT_IN_PROVIDERS:
            continue
        if scheme == "file":
            path = str(Path(cwd or ".", path).resolve()) if not Path(path).is_absolute() else path
            if Path(path).resolve() == CONF_DIR.resolve():
                continue
        source = (entry.get("provider") or "command-line", f"{scheme}://{path}")
        if source not in sources:
            sources.append(source)
    return sources, cwd


def hydra_runtime(saved: Path) -> dict:
    """hydra.runtime of a run's .hydra/hydra.yaml ({} where the file is empty); a file that is YAML but not Hydra's
    is a DamagedFile naming it."""
    hydra = (read_yaml(saved, dict) or {}).get("hydra", {})
    runtime = hydra.get("runtime", {}) if isinstance(hydra, dict) else None
    sources = runtime.get("config_sources") or [] if isinstance(runtime, dict) else None
    if not isinstance(sources, list) or not all(isinstance(entry, dict) for entry in sources):
        raise DamagedFile(f"{saved}: not a Hydra run's hydra.yaml (no mapping hydra.runtime.config_sources)")
    return runtime


def composed(source: Source):
    """The training config `source` names, the user's modules importable (reward components, verifier, dataset
    function) from the current directory as in training, else from the directory the run was started in."""
    ensure_cwd_importable()
    if source.run_cwd and os.path.isdir(source.run_cwd) and source.run_cwd not in sys.path:
        sys.path.append(source.run_cwd)
    return compose_with(source.config_sources, source.overrides)


def compose_with(sources: list[tuple[str, str]], overrides: list[str]):
    """The training config composed on conf/ (Hydra's compose API), with these config directories on the search
    path where Hydra's --config-dir and hydra.searchpath put theirs: after conf/, before the structured schema."""
    paths = [path for _, path in sources]
    searchpath = [f"hydra.searchpath=[{','.join(_quoted(path) for path in paths)}]"] if paths else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides + searchpath)


def _quoted(text: str) -> str:
    """A string in Hydra's override grammar, whatever it holds (spaces, commas, quotes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
