"""`python -m grpo_exp.evaluate`: held-out greedy accuracy, and pass@k / maj@k from k samples.

python -m grpo_exp.evaluate outputs/runs/<date>/<time>          # a run directory: its config and checkpoint
python -m grpo_exp.evaluate path/to/checkpoint dataset=chain_sum  # a checkpoint, with any overrides
python -m grpo_exp.evaluate model=smollm2_135m eval.samples=8     # a model config
python -m grpo_exp.evaluate --config-dir configs path/to/checkpoint reward=math+mine  # with your own configs
"""

import json
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from grpo_exp.errors import UserError, run_command
from grpo_exp.import_collection import without_collection
from grpo_exp.process_exit import run_then_exit
from grpo_exp.run.config_store import register_schemas
from grpo_exp.run.sources import command_args, composed, resolve_source
from grpo_exp.run_files import check_command_outputs, new_evaluation_files

if TYPE_CHECKING:
    from grpo_exp.run.heldout import SampledResult

EPILOG = """\
The first argument may be a grpo_exp run directory (its config is re-composed and its checkpoint-final
evaluated), one of its checkpoints (<run dir>/checkpoint-best: the best validation's model, with the run's config;
results in that directory), or a model checkpoint directory; every other argument is a Hydra override of the training
config (dataset=..., eval.samples=..., eval.temperature=..., eval.batch_size=..., eval.log_to_wandb=true,
eval.verification_benchmark.enabled=true: the model's P(Yes) on the verification benchmark, a run directory's
own set when it has one).
A run directory's config is composed from the config directories the run had (its --config-dir, hydra.searchpath:
.hydra/hydra.yaml), your own reward components, datasets and verifier functions included; their modules import
from the current directory, else the run's. --config-dir DIR adds a config directory, as `grpo-exp train` does.
Results are printed and written to <run dir>/evaluation.json (or <outputs_dir>/eval/<time>/evaluation.json), with
the labels, the answer extractor and the overrides they were measured with; each problem's answers (greedy, and the
eval.samples samples) with their labels go to evaluation.jsonl beside it. A later evaluation of the same directory
writes evaluation_2.json (and .jsonl), and so on: none is overwritten.
"""


def parse_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments, the --config-dir directories)."""
    return command_args(argv, "python -m grpo_exp.evaluate", __doc__, EPILOG, "[RUN_DIR | CHECKPOINT] [KEY=VALUE ...]")


def write_answers(path: Path, greedy: list[dict], sampled: "SampledResult | None") -> None:
    """One line per problem: its question, reference, greedy answer and (eval.samples > 0) its sampled answers, each
    with the extracted answer and its label."""
    with path.open("w", encoding="utf-8") as f:
        for index, problem in enumerate(greedy):
            line = {key: problem[key] for key in ("question", "solution")}
            line["greedy"] = {key: problem[key] for key in ("completion", "answer", "correct")}
            if sampled is not None:
                line["samples"] = sampled.answers[index]
            f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> dict:
    warnings.filterwarnings("ignore", category=FutureWarning)
    register_schemas()
    source = resolve_source(*parse_args(sys.argv[1:] if argv is None else argv))
    # torch, the model libraries and the run's modules: after the arguments (--help, a bad one: answered without them)
    with without_collection():  # grpo_exp.import_collection
        import torch

        from grpo_exp.run.evaluation import HeldoutEval
        from grpo_exp.run.resolve import resolve
        from grpo_exp.run.setup import HELDOUT, load_policy, set_up
        from grpo_exp.run.tracking import Tracker, masked_override
        from grpo_exp.run.vllm_evaluation import answered_through_vllm

    overrides, out_dir = source.overrides, source.out_dir
    cfg = composed(source)
    spec = resolve(cfg, processes=1, evaluating=True)
    if spec.native_tool_calling:
        raise UserError(
            "rollout.tool_calling: this run's environments ran through TRL's tool-calling loop, and grpo-exp evaluate "
            "plays held-out episodes with grpo_exp's loop (tags): add rollout.tool_calling=tags to evaluate them there"
        )
    given_dir = out_dir is not None
    out_dir = out_dir or Path(cfg.outputs_dir) / "eval" / time.strftime("%Y-%m-%d_%H-%M-%S")
    check_command_outputs(cfg, out_dir, given_dir)
    inputs = set_up(spec, checked=(HELDOUT,))
    train, heldout, parts = inputs.train, inputs.heldout, inputs.parts
    tokenizer, model = load_policy(spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    evaluation = HeldoutEval(spec, parts, tokenizer, heldout, out_dir, train)
    results_file, answers_file = new_evaluation_files(out_dir)  # an earlier evaluation is kept
    with answered_through_vllm(cfg, model, tokenizer) as engine:
        greedy = evaluation.greedy(model)
        results = {
            "model": cfg.model.name_or_path or cfg.model.name,
            "dataset": cfg.dataset.name,
            "problems": greedy.scored,
            "greedy accuracy": greedy.accuracy,
        }
        sampled = None
        if cfg.eval.samples > 0:
            torch.manual_seed(cfg.trainer.seed)
            sampled = evaluation.sampled(model, heldout, cfg.eval.samples)
            results |= sampled.metrics
    results |= {f"greedy {key}": value for key, value in greedy.rollout.items()}
    if cfg.eval.verification_benchmark.enabled:
        evaluation.prepare_benchmark(model)
        results |= evaluation.benchmark_metrics(model)
    write_answers(answers_file, greedy.samples, sampled)
    recorded = {
        "labels": cfg.verifier.labels,
        "answer": parts.verifier.answer_rule,
        "overrides": [masked_override(o) for o in overrides],
        "answers_file": answers_file.name,
        "answered by": engine or "transformers",
    }
    as_json = {k: None if isinstance(v, float) and v != v else v for k, v in results.items()}  # NaN -> null
    results_file.write_text(json.dumps(as_json | recorded, indent=2) + "\n", encoding="utf-8")
    table = Table(title=f"held-out evaluation ({cfg.dataset.name})", show_header=False)
    for key, value in results.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    table.add_row("labels / answer", f"{recorded['labels']} / {recorded['answer']}")
    table.add_row("answered by", recorded["answered by"])
    Console(width=120).print(table)
    print(f"Written to {results_file} (each problem's answers: {answers_file.name})")
    if cfg.eval.log_to_wandb:
        name = f"eval:{results['model']}"
        tracker = Tracker(cfg.logger, out_dir, name, None, [], spec.saved_config, job_type="eval")
        tracker.summary({k: v for k, v in results.items() if isinstance(v, int | float)})
        tracker.finish(failed=False)
    return results


if __name__ == "__main__":
    run_then_exit(run_command, main)  # a bad override or input: its message, not a traceback
