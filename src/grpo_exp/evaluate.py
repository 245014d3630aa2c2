"""`python -m grpo_exp.evaluate`: held-out greedy accuracy, and pass@k / maj@k from k samples.

python -m grpo_exp.evaluate outputs/runs/<date>/<time>          # a run directory: its config and checkpoint
python -m grpo_exp.evaluate path/to/checkpoint dataset=chain_sum  # a checkpoint, with any overrides
python -m grpo_exp.evaluate model=smollm2_135m eval.samples=8     # a model config
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from rich.console import Console
from rich.table import Table

from grpo_exp.data import load_splits
from grpo_exp.errors import UserError
from grpo_exp.models import load_model, load_tokenizer
from grpo_exp.paths import CONF_DIR
from grpo_exp.run.build import build_parts
from grpo_exp.run.files import BENCHMARK_FILE, EVALUATION_FILE, FINAL_CHECKPOINT_DIR
from grpo_exp.run.heldout import benchmark_statistics, run_heldout_accuracy, sampled_metrics, verification_benchmark
from grpo_exp.run.resolve import resolve
from grpo_exp.run.tracking import Tracker
from grpo_exp.run.validation import BEST_CHECKPOINT_DIR
from grpo_exp.schema import register_schemas
from grpo_exp.verification.benchmark import load_benchmark

EPILOG = """\
The first argument may be a grpo_exp run directory (its config is re-composed and its checkpoint-final
evaluated), one of its checkpoints (<run dir>/checkpoint-best: the best validation's model, with the run's config;
results in that directory), or a model checkpoint directory; every other argument is a Hydra override of the training
config (dataset=..., eval.samples=..., eval.temperature=..., eval.batch_size=..., eval.log_to_wandb=true,
eval.verification_benchmark.enabled=true: the model's P(Yes) on the verification benchmark, a run directory's
own set when it has one).
Results are printed and written to <run dir>/evaluation.json (or <outputs_dir>/eval/<time>/evaluation.json).
"""


def parse_args(argv: list[str]) -> list[str]:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_exp.evaluate",
        description=__doc__.split("\n\n", 1)[0].strip("`").split(": ", 1)[-1],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("args", nargs="*", metavar="[RUN_DIR | CHECKPOINT] [KEY=VALUE ...]")
    return parser.parse_args(argv).args


def resolve_source(argv: list[str]) -> tuple[list[str], Path | None]:
    """(Hydra overrides, output directory) for a run directory, a checkpoint, or a plain model config (None: a new
    directory under outputs_dir, known once the config is composed)."""
    if not argv or "=" in argv[0]:
        return argv, None
    source, overrides = Path(argv[0]), argv[1:]
    run_dir, checkpoint = source, source / FINAL_CHECKPOINT_DIR
    if source.name in (FINAL_CHECKPOINT_DIR, BEST_CHECKPOINT_DIR) and (source.parent / ".hydra").is_dir():
        run_dir, checkpoint = source.parent, source  # a run's own checkpoint: evaluated with the run's config
    if (run_dir / ".hydra" / "overrides.yaml").is_file() and checkpoint.is_dir():
        # Re-compose the run's own config (its overrides), then point the model at the checkpoint.
        run_overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []
        kept = [o for o in run_overrides if not o.lstrip("+~").startswith("hydra.")]
    elif (source / "config.json").is_file():
        checkpoint, kept = source, []
    else:
        raise UserError(
            f"{source}: not a grpo_exp run directory (with {FINAL_CHECKPOINT_DIR}/) nor a model checkpoint "
            "(with config.json); see --help"
        )
    model = ["model.source=pretrained", f"model.name_or_path={checkpoint.resolve()}", "model.lora.enabled=false"]
    return kept + model + overrides, source


def main(argv: list[str] | None = None) -> dict:
    warnings.filterwarnings("ignore", category=FutureWarning)
    register_schemas()
    overrides, out_dir = resolve_source(parse_args(sys.argv[1:] if argv is None else argv))
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    spec = resolve(cfg, processes=1)
    out_dir = out_dir or Path(cfg.outputs_dir) / "eval" / time.strftime("%Y-%m-%d_%H-%M-%S")
    parts = build_parts(spec)
    verifier, rollout = parts.verifier, parts.rollout
    train, heldout = load_splits(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, cfg.trainer.seed)
    max_new_tokens = spec.eval_max_new_tokens
    greedy = run_heldout_accuracy(model, tokenizer, heldout, spec, parts, "greedy")
    results = {
        "model": cfg.model.name_or_path or cfg.model.name,
        "dataset": cfg.dataset.name,
        "problems": greedy.scored,
        "greedy accuracy": greedy.accuracy,
    }
    if cfg.eval.samples > 0:
        torch.manual_seed(cfg.trainer.seed)
        results |= sampled_metrics(
            model,
            tokenizer,
            heldout,
            verifier,
            cfg.eval.samples,
            cfg.eval.temperature,
            max_new_tokens,
            cfg.eval.batch_size,
            rollout,
        )
    results |= {f"greedy {key}": value for key, value in greedy.rollout.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.eval.verification_benchmark.enabled:
        # A run directory's own set (its initial policy's answers); else one built from (or cached for) this model.
        own = out_dir / BENCHMARK_FILE
        examples = (
            load_benchmark(own)
            if own.is_file()
            else verification_benchmark(spec, model, tokenizer, train, heldout, verifier, out_dir)
        )
        results |= benchmark_statistics(model, tokenizer, examples, spec)
    as_json = {k: None if isinstance(v, float) and v != v else v for k, v in results.items()}  # NaN -> null
    (out_dir / EVALUATION_FILE).write_text(json.dumps(as_json, indent=2) + "\n", encoding="utf-8")
    table = Table(title=f"held-out evaluation ({cfg.dataset.name})", show_header=False)
    for key, value in results.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    Console(width=120).print(table)
    print(f"Written to {out_dir / EVALUATION_FILE}")
    if cfg.eval.log_to_wandb:
        name = f"eval:{results['model']}"
        tracker = Tracker(cfg.logger, out_dir, name, None, [], spec.saved_config, job_type="eval")
        tracker.summary({k: v for k, v in results.items() if isinstance(v, int | float)})
        tracker.finish(failed=False)
    return results


if __name__ == "__main__":
    try:
        main()
    except (UserError, HydraException) as err:  # a bad override or input: its message, not a traceback
        raise SystemExit(f"Error: {err}") from None
