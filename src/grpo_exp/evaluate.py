"""Held-out evaluation: greedy accuracy, and pass@k / maj@k from k samples, judged by a verifier.

    python -m grpo_exp.evaluate outputs/runs/<date>/<time>          # a run directory: its config and checkpoint
    python -m grpo_exp.evaluate path/to/checkpoint dataset=chain_sum  # a checkpoint, with any overrides
    python -m grpo_exp.evaluate model=smollm2_135m eval.samples=8     # a model config

Training calls `heldout_accuracy` for its before/after summary.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from tqdm.auto import tqdm

from grpo_exp.models import left_padded_eval
from grpo_exp.verification import Verifier


@dataclass
class EvalResult:
    accuracy: float  # correct / scored (problems with an unparseable reference are not scored)
    correct: int
    scored: int
    samples: list[dict] = field(default_factory=list)
    verification: dict[str, float] = field(default_factory=dict)  # self-verification metrics, when the task is on
    rollout: dict[str, float] = field(default_factory=dict)  # turns, tool calls... for rollout=multiturn


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    batch_size: int,
    desc: str | None,
    temperature: float = 0.0,
    stop_strings: list[str] | None = None,
) -> list[str]:
    """Completions for chat prompts, batched with left padding: greedy at temperature 0, else sampled.

    Generation of a sequence ends at EOS or at the first of `stop_strings` (kept in the text)."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    completions: list[str] = []
    with left_padded_eval(model, tokenizer):
        for start in tqdm(range(0, len(texts), batch_size), desc=desc, unit="batch", disable=desc is None):
            batch = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(model.device)
            output = model.generate(
                **batch,
                do_sample=temperature > 0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                temperature=temperature or None,
                top_p=None,
                top_k=None,
                stop_strings=stop_strings,
                tokenizer=tokenizer if stop_strings else None,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return completions


def answer(model, tokenizer, prompts: list, max_new_tokens: int, batch_size: int, desc: str | None,
           temperature: float = 0.0, rollout=None) -> tuple[list[str], list[dict]]:  # fmt: skip
    """The texts that hold each prompt's answer, and per-prompt details: one completion each, or with a
    multi-turn rollout each trajectory's final turn (details: the trajectory, its turns and tool calls)."""
    if rollout is None:
        texts = generate_completions(model, tokenizer, prompts, max_new_tokens, batch_size, desc, temperature)
        return texts, [{} for _ in texts]
    from grpo_exp.rollout import greedy_generation

    generation = greedy_generation(tokenizer)
    if temperature > 0:
        generation |= {"do_sample": True, "temperature": temperature}
    trajectories = rollout.run(model, tokenizer, prompts, generation, batch_size, desc)
    details = [{"trajectory": tokenizer.decode(t.completion_ids, skip_special_tokens=True), **t.fields()}
               for t in trajectories]  # fmt: skip
    return [t.final_turn for t in trajectories], details


def heldout_accuracy(
    model, tokenizer, dataset: Dataset, verifier: Verifier, max_new_tokens: int, batch_size: int, desc: str,
    rollout=None,
) -> EvalResult:  # fmt: skip
    """Greedy accuracy; with a multi-turn rollout, of each trajectory's final answer (the tools in reach)."""
    completions, details = answer(model, tokenizer, dataset["prompt"], max_new_tokens, batch_size, desc, 0.0, rollout)
    labels = verifier(completions, dataset["solution"])
    stats = {}
    if rollout is not None:
        from grpo_exp.flow import trajectory_statistics

        stats = trajectory_statistics(details, [float("nan") if label is None else float(label) for label in labels])
    scored = [label for label in labels if label is not None]
    samples = [
        {"question": q, "solution": s, "completion": c, "correct": label, **extra}
        for q, s, c, label, extra in zip(
            dataset["question"], dataset["solution"], completions, labels, details, strict=True
        )  # fmt: skip
    ]
    correct = sum(scored)
    return EvalResult(correct / len(scored) if scored else float("nan"), correct, len(scored), samples, rollout=stats)


def sampled_metrics(
    model, tokenizer, dataset: Dataset, verifier: Verifier, samples: int, temperature: float, max_new_tokens: int,
    batch_size: int, rollout=None,
) -> dict[str, float]:  # fmt: skip
    """pass@1..k (unbiased) and maj@k from k sampled completions per problem."""
    from grpo_exp.stats import correctness_stats, final_answer, majority_vote_accuracy

    prompts = [p for p in dataset["prompt"] for _ in range(samples)]
    solutions = [s for s in dataset["solution"] for _ in range(samples)]
    texts, _ = answer(
        model, tokenizer, prompts, max_new_tokens, batch_size, f"held-out samples (k={samples})", temperature, rollout
    )
    labels = [float("nan") if label is None else float(label) for label in verifier(texts, solutions)]
    correct = torch.tensor(labels).view(-1, samples)
    answers = [[final_answer(t) for t in texts[i : i + samples]] for i in range(0, len(texts), samples)]
    stats = {k.removeprefix("groups/"): v for k, v in correctness_stats(correct).items() if "@" in k}
    return stats | {f"maj@{samples}": majority_vote_accuracy(answers, correct)}


def self_verification_metrics(
    model, tokenizer, dataset: Dataset, verifier: Verifier, task_cfg, max_new_tokens: int, batch_size: int, seed: int,
    samples: int = 2, temperature: float = 1.0,
) -> dict[str, float]:  # fmt: skip
    """How well the policy judges its own answers on held-out problems.

    Answers are sampled (`samples` per problem) and labelled by the rule verifier; a balanced, diverse set of
    them (the training task's own selection, all-wrong problems kept) is put to the policy as verification
    prompts, answered greedily. Reports verdict accuracy (50% is chance on a balanced set), precision /
    recall / F1 of "Yes", and AUROC / Brier / ECE of the policy's P(Yes).
    """
    from omegaconf import OmegaConf

    from grpo_exp.schema import VerifierName, VerifierSchema
    from grpo_exp.selfverify import (
        candidates_from_groups,
        filter_candidates,
        judgement_metrics,
        parse_judgement,
        probability_metrics,
        select_samples,
        shown_answer,
        verification_prompt,
    )
    from grpo_exp.verification import PYesScorer

    torch.manual_seed(seed)
    prompts = [p for p in dataset["prompt"] for _ in range(samples)]
    texts = generate_completions(model, tokenizer, prompts, max_new_tokens, batch_size, "own answers", temperature)
    labels = verifier(texts, [s for s in dataset["solution"] for _ in range(samples)])
    candidates = candidates_from_groups(dataset["question"], texts, labels, samples)
    kept, _ = filter_candidates(candidates, drop_no_answer=True, drop_all_wrong=False)
    chosen = select_samples(kept, len(dataset), 0.5, samples, seed)
    if not chosen:
        return {}
    conversations = [verification_prompt(c, task_cfg.template, task_cfg.show) for c in chosen]
    verdicts = generate_completions(model, tokenizer, conversations, max_new_tokens, batch_size, "verdicts")
    actual = [c.correct for c in chosen]
    strict = task_cfg.get("strict_verdict", True)
    predicted = [None if v is None else v == "Yes" for v in (parse_judgement(text, strict) for text in verdicts)]
    scorer = PYesScorer(OmegaConf.structured(VerifierSchema(name=VerifierName.self, batch_size=batch_size)), None, "")
    scorer.bind(model, tokenizer)  # the policy's own P(Yes)
    p_yes = scorer([c.question for c in chosen], [shown_answer(c, task_cfg.show) for c in chosen])
    return (
        {"verify/examples": len(chosen), "verify/yes_share": sum(actual) / len(actual)}
        | judgement_metrics(predicted, actual, "verify")
        | probability_metrics(p_yes, actual, "verify/p_yes")
    )


def resolve_source(argv: list[str]) -> tuple[list[str], Path]:
    """(Hydra overrides, output directory) for a run directory, a checkpoint, or a plain model config."""
    import time

    import yaml

    from grpo_exp.errors import UserError

    if not argv or "=" in argv[0]:
        return argv, Path("outputs") / "eval" / time.strftime("%Y-%m-%d_%H-%M-%S")
    source, overrides = Path(argv[0]), argv[1:]
    if (source / ".hydra" / "overrides.yaml").is_file() and (source / "checkpoint-final").is_dir():
        # Re-compose the run's own config (its overrides), then point the model at its final checkpoint.
        run_overrides = yaml.safe_load((source / ".hydra" / "overrides.yaml").read_text()) or []
        checkpoint = source / "checkpoint-final"
        kept = [o for o in run_overrides if not o.lstrip("+~").startswith("hydra.")]
    elif (source / "config.json").is_file():
        checkpoint, kept = source, []
    else:
        raise UserError(f"{source}: not a grpo_exp run directory (with checkpoint-final/) nor a model checkpoint")
    model = ["model.source=pretrained", f"model.name_or_path={checkpoint.resolve()}", "model.lora.enabled=false"]
    return kept + model + overrides, source


def main(argv: list[str] | None = None) -> dict:
    import json
    import sys
    import warnings

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from rich.console import Console
    from rich.table import Table

    from grpo_exp.data import load_splits
    from grpo_exp.experiment import build_rollout
    from grpo_exp.models import check_reachable, load_model, load_tokenizer
    from grpo_exp.paths import CONF_DIR
    from grpo_exp.schema import register_schemas
    from grpo_exp.tracking import Tracker, redact
    from grpo_exp.verification import math_verify_verifier

    warnings.filterwarnings("ignore", category=FutureWarning)
    register_schemas()
    overrides, out_dir = resolve_source(sys.argv[1:] if argv is None else argv)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    verifier = math_verify_verifier()
    check_reachable(cfg.model)
    _, heldout = load_splits(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, cfg.trainer.seed)
    max_new_tokens = cfg.eval.max_new_tokens or cfg.trainer.max_completion_length
    rollout = build_rollout(cfg)
    greedy = heldout_accuracy(
        model, tokenizer, heldout, verifier, max_new_tokens, cfg.eval.batch_size, "greedy", rollout
    )
    results = {"model": cfg.model.name_or_path or cfg.model.name, "dataset": cfg.dataset.name,
               "problems": greedy.scored, "greedy accuracy": greedy.accuracy}  # fmt: skip
    if cfg.eval.samples > 0:
        torch.manual_seed(cfg.trainer.seed)
        results |= sampled_metrics(
            model, tokenizer, heldout, verifier, cfg.eval.samples, cfg.eval.temperature, max_new_tokens,
            cfg.eval.batch_size, rollout,
        )  # fmt: skip
    results |= {f"greedy {key}": value for key, value in greedy.rollout.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    as_json = {k: None if isinstance(v, float) and v != v else v for k, v in results.items()}  # NaN -> null
    (out_dir / "evaluation.json").write_text(json.dumps(as_json, indent=2) + "\n", encoding="utf-8")
    table = Table(title=f"held-out evaluation ({cfg.dataset.name})", show_header=False)
    for key, value in results.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    Console(width=120).print(table)
    print(f"Written to {out_dir / 'evaluation.json'}")
    if cfg.eval.log_to_wandb:
        config = redact(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
        tracker = Tracker(cfg.logger, out_dir, f"eval:{results['model']}", None, [], config, job_type="eval")
        tracker.summary({k: v for k, v in results.items() if isinstance(v, int | float)})
        tracker.finish(failed=False)
    return results


if __name__ == "__main__":
    from grpo_exp.errors import UserError

    try:
        main()
    except UserError as err:
        raise SystemExit(f"Error: {err}") from None
