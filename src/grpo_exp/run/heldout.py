"""Held-out evaluation: greedy accuracy, and pass@k / maj@k from k samples, judged by the run's correctness labels
(verifier.labels: grpo_exp.verification.labels).

Training measures it before and after (grpo_exp.run.experiment); `python -m grpo_exp.evaluate` on its own.
With a multi-turn rollout the policy answers with its tools in reach and each trajectory's final turn is judged.
"""

import asyncio
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset

from grpo_exp.answers import lenient_match
from grpo_exp.data import unseen_problems
from grpo_exp.data_parallel import from_main_process, map_over_processes
from grpo_exp.generation import PolicyAnswers, generate_completions, prompt_ids
from grpo_exp.rewards.components import graded_components
from grpo_exp.rewards.judge import RubricJudge
from grpo_exp.rollout.environment import environment_statistics
from grpo_exp.rollout.flow import trajectory_statistics
from grpo_exp.rollout.multiturn import MultiTurnRollout, greedy_generation
from grpo_exp.rollout.vllm_turns import ANSWERING_ENGINE, engine_completions
from grpo_exp.run.build import RunParts
from grpo_exp.run.distributed import is_main_process
from grpo_exp.run.prepacked_eval import prepacked_completions, prepacked_copy, release_prepacked
from grpo_exp.run.resolve import RunSpec
from grpo_exp.run_files import BENCHMARK_FILE
from grpo_exp.stats import (
    constant_answer_accuracy,
    correctness_stats,
    distinct_answer_share,
    final_answers,
    label_values,
    majority_vote_accuracy,
    per_task_means,
    score_statistics,
)
from grpo_exp.text import prompt_text
from grpo_exp.trainer.scored_batch import TASK_COLUMNS
from grpo_exp.verification.benchmark import (
    benchmark_key,
    build_benchmark,
    load_benchmark,
    save_benchmark,
    score_benchmark,
)
from grpo_exp.verification.labels import Labels
from grpo_exp.verification.p_yes import PYesScorer
from grpo_exp.verification.selfverify import Candidate
from grpo_exp.verification.task_score import entries_of

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    accuracy: float  # correct / scored (problems with an unparseable reference are not scored)
    correct: int
    scored: int
    samples: list[dict] = field(default_factory=list)
    verification: dict[str, float] = field(default_factory=dict)  # self-verification metrics, when the task is on
    rollout: dict[str, float] = field(default_factory=dict)  # turns, tool calls... for rollout=multiturn
    judge: dict[str, float] = field(default_factory=dict)  # the judge's scores of these answers, when it is on
    tasks: dict[str, float] = field(default_factory=dict)  # a reasoning-gym mix: accuracy/<task>
    # Right in content whatever the format (grpo_exp.answers.lenient_match), over the problems `accuracy` scores.
    lenient_accuracy: float | None = None

    def recorded(self) -> dict:
        """What a later attempt needs of it (the per-problem samples are in eval_<when>.jsonl)."""
        return {key: value for key, value in vars(self).items() if key != "samples"}


@dataclass
class SampledResult:
    metrics: dict[str, float]  # pass@1..k, mean@k, maj@k
    answers: list[list[dict]]  # per problem, its k completions: {completion, answer, correct}


def answer(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    batch_size: int,
    desc: str | None,
    temperature: float = 0.0,
    rollout: MultiTurnRollout | None = None,
    prepacked: bool = False,
    rows: list[dict] | None = None,
) -> tuple[list[str], list[dict]]:
    """The texts that hold each prompt's answer, and per-prompt details: one completion each, or with a
    multi-turn rollout each trajectory's final turn (details: the trajectory, its turns and tool calls).
    Under several processes, each answers its share of the prompts (grpo_exp.data_parallel). prepacked: single-turn
    answers (greedy or sampled) and greedy trajectories from the policy's prepacked copy where it can serve
    (grpo_exp.run.prepacked_eval). rows: the prompts' dataset rows, which a rollout's environments are reset with."""

    engine = ANSWERING_ENGINE.get()  # the run generates with vLLM (grpo_exp.rollout.vllm_turns)

    def work(share: list, main: bool) -> list[tuple[str, dict]]:
        shown = desc if main else None
        share, share_rows = [prompt for prompt, _ in share], [row for _, row in share]
        if rollout is None and engine is not None:
            ids = engine_completions(engine, [prompt_ids(tokenizer, p) for p in share], max_new_tokens, temperature)
            return [(tokenizer.decode(row, skip_special_tokens=True), {}) for row in ids]
        if rollout is None:
            texts = None
            if prepacked:
                texts = prepacked_completions(model, tokenizer, share, max_new_tokens, batch_size, shown, temperature)
            if texts is None:
                texts = generate_completions(model, tokenizer, share, max_new_tokens, batch_size, shown, temperature)
            return [(text, {}) for text in texts]
        generation = greedy_generation(tokenizer)
        if temperature > 0:
            generation |= {"do_sample": True, "temperature": temperature}
        player = model
        # the same trajectories, from the copy (turn_cache's tests)
        if prepacked and temperature == 0 and share and engine is None:
            sampling_copy = prepacked_copy(model, prompt_ids(tokenizer, share[0]))
            player = model if sampling_copy is None else sampling_copy.copy
        try:
            trajectories = rollout.run(
                player, tokenizer, share, generation, batch_size, shown, rows=share_rows, engine=engine
            )
        finally:
            release_prepacked(model)
        return [
            (t.final_turn, {"trajectory": tokenizer.decode(t.completion_ids, skip_special_tokens=True), **t.fields()})
            for t in trajectories
        ]

    paired = list(zip(prompts, rows or [{}] * len(prompts), strict=True))
    answered = map_over_processes(paired, batch_size, work)
    return [text for text, _ in answered], [details for _, details in answered]


def policy_answers(model, tokenizer, spec: RunSpec) -> PolicyAnswers:
    """The policy's single-turn answers as the run's held-out evaluation gives them (its vLLM engine, else
    eval.prepacked's copy, else generate(); eval.batch_size, the held-out answers' length), for the measures that
    put its own answers to it: self-verification's, the verification benchmark's."""

    def answers(prompts: list, temperature: float, desc: str | None) -> list[str]:
        eval_cfg = spec.cfg.eval
        max_new_tokens, batch_size = spec.eval_max_new_tokens, eval_cfg.batch_size
        prepacked = eval_cfg.prepacked
        return answer(model, tokenizer, prompts, max_new_tokens, batch_size, desc, temperature, prepacked=prepacked)[0]

    return answers


def heldout_accuracy(
    model,
    tokenizer,
    dataset: Dataset,
    verifier: Labels,
    max_new_tokens: int,
    batch_size: int,
    desc: str,
    rollout: MultiTurnRollout | None = None,
    prepacked: bool = False,
) -> EvalResult:
    """Greedy accuracy; with a multi-turn rollout, of each trajectory's final answer (the tools in reach)."""
    prompts = dataset["prompt"]
    rows = dataset.to_list() if rollout is not None else None
    completions, details = answer(
        model, tokenizer, prompts, max_new_tokens, batch_size, desc, 0.0, rollout, prepacked=prepacked, rows=rows
    )
    labels = verifier(completions, dataset["solution"], entries_of(dataset))
    stats = {}
    if rollout is not None:
        stats = trajectory_statistics(details, label_values(labels), verifier.answer)
        stats |= environment_statistics(details)
    scored = [label for label in labels if label is not None]
    columns = [dataset[key] for key in ("question", "prompt", "solution")]
    tagged = {key: dataset[key] for key in TASK_COLUMNS if key in dataset.column_names}
    tags = [{key: values[i] for key, values in tagged.items()} for i in range(len(dataset))]
    samples = [
        {"question": q, "prompt": p, "solution": s, "completion": c, "answer": verifier.answer(c), "correct": label}
        | tag
        | extra
        for q, p, s, c, label, tag, extra in zip(*columns, completions, labels, tags, details, strict=True)
    ]
    correct = sum(scored)
    lenient = [lenient_match(s["completion"], s["solution"]) for s in samples if s["correct"] is not None]
    lenient_accuracy = sum(map(bool, lenient)) / len(lenient) if lenient else None
    accuracy = correct / len(scored) if scored else float("nan")
    tasks = task_accuracies(samples)
    return EvalResult(
        accuracy, correct, len(scored), samples, rollout=stats, lenient_accuracy=lenient_accuracy, tasks=tasks
    )


def run_heldout_accuracy(model, tokenizer, dataset: Dataset, spec: RunSpec, parts: RunParts, desc: str | None):
    """heldout_accuracy with the run's own settings: its verifier and rollout, eval.batch_size, eval.prepacked and
    the held-out answers' length."""
    eval_cfg = spec.cfg.eval
    return heldout_accuracy(
        model,
        tokenizer,
        dataset,
        parts.verifier,
        spec.eval_max_new_tokens,
        eval_cfg.batch_size,
        desc,
        parts.rollout,
        prepacked=eval_cfg.prepacked,
    )


def sampled_metrics(
    model,
    tokenizer,
    dataset: Dataset,
    verifier: Labels,
    samples: int,
    temperature: float,
    max_new_tokens: int,
    batch_size: int,
    rollout: MultiTurnRollout | None = None,
    prepacked: bool = False,
) -> SampledResult:
    """pass@1..k (unbiased) and maj@k from k sampled completions per problem, and the completions (single-turn ones
    from the policy's prepacked copy where it can serve, `prepacked`)."""
    prompts = [p for p in dataset["prompt"] for _ in range(samples)]
    solutions = [s for s in dataset["solution"] for _ in range(samples)]
    rows = [row for row in dataset.to_list() for _ in range(samples)] if rollout is not None else None
    desc = f"held-out samples (k={samples})"
    texts, _ = answer(
        model,
        tokenizer,
        prompts,
        max_new_tokens,
        batch_size,
        desc,
        temperature,
        rollout,
        prepacked=prepacked,
        rows=rows,
    )
    labels = verifier(texts, solutions, entries_of(dataset, samples))
    correct = torch.tensor(label_values(labels)).view(-1, samples)
    answers = [final_answers(texts[i : i + samples], verifier.answer) for i in range(0, len(texts), samples)]
    stats = {k.removeprefix("groups/"): v for k, v in correctness_stats(correct).items() if "@" in k}
    answered = [
        {"completion": text, "answer": verifier.answer(text), "correct": label}
        for text, label in zip(texts, labels, strict=True)
    ]
    per_problem = [answered[i : i + samples] for i in range(0, len(answered), samples)]
    return SampledResult(stats | {f"maj@{samples}": majority_vote_accuracy(answers, correct)}, per_problem)


def judge_statistics(judge: RubricJudge, samples: list[dict]) -> dict[str, float]:
    """The judge's scores of held-out answers (heldout_accuracy's samples): their mean, failures, and AUROC against
    correctness."""
    pairs = [(prompt_text(s["prompt"]), s["completion"]) for s in samples]
    rewards, counters = asyncio.run(judge.score(pairs))
    return _answer_statistics("judge", rewards, samples) | {"judge/failures": counters["judge/failures"]}


def validation_metrics(samples: list[dict], parts: RunParts) -> dict[str, float]:
    """A validation's metrics from heldout_accuracy's samples, the same on every process: heldout/accuracy, and the
    mean and AUROC against the verifier's labels of each learned reward component of the mix (judge, confidence),
    as heldout/<name>/mean and heldout/<name>/auroc."""
    scored = [s["correct"] for s in samples if s["correct"] is not None]
    stats = {"accuracy": sum(scored) / len(scored) if scored else math.nan} | task_accuracies(samples)
    stats |= environment_statistics(samples)  # rollout=environment: each environment's success and mean reward
    confidence = next((f for f in parts.reward_funcs if f.__name__ == "confidence"), None)
    if confidence is not None:
        stats |= _confidence_statistics(confidence, parts.p_yes, samples)
    if parts.judge is not None:  # asked once, by the main process
        judged = from_main_process(lambda: judge_statistics(parts.judge, samples))
        stats |= {key: value for key, value in judged.items() if key != "judge/failures"}
    return {f"heldout/{key}": value for key, value in stats.items()}


def task_accuracies(samples: list[dict]) -> dict[str, float]:
    """A reasoning-gym mix's held-out accuracy per task, as `accuracy/<task>`, beside what one constant answer would
    score (`constant/<task>`) and the distinct answers per problem (`distinct/<task>`): a policy that answers every
    syllogism "Yes" scores the share of Yes. Nothing for one task."""
    tasks = [s.get("task_name") for s in samples]
    measures = per_task_means(tasks, label_values([s["correct"] for s in samples]), "accuracy")
    for task in {key.split("/", 1)[1] for key in measures}:
        mine = [s for s in samples if s.get("task_name") == task]
        measures[f"constant/{task}"] = constant_answer_accuracy([s["solution"] for s in mine])
        measures[f"distinct/{task}"] = distinct_answer_share([s["answer"] for s in mine])
    return measures


def learned_components(parts: RunParts) -> tuple[str, ...]:
    """The learned components of the reward mix: those whose agreement with the verifier's labels can drift."""
    return tuple(func.__name__ for func in parts.reward_funcs if func.__name__ in graded_components())


def _confidence_statistics(reward_func, p_yes: PYesScorer, samples: list[dict]) -> dict[str, float]:
    """The confidence reward of the answers, as training computes it, every process scoring a share."""
    texts = [s["completion"] for s in samples]
    split, p_yes.split = p_yes.split, True
    try:
        rewards = reward_func(
            prompts=[s["prompt"] for s in samples],
            completions=[[{"role": "assistant", "content": text}] for text in texts],
            final_turn=texts,  # a multi-turn rollout's reward reads the final turn
            question=[s["question"] for s in samples],
            solution=[s["solution"] for s in samples],
        )
    finally:
        p_yes.split = split
    return _answer_statistics("confidence", rewards, samples)


def _answer_statistics(name: str, rewards: list[float | None], samples: list[dict]) -> dict[str, float]:
    """A graded component's scores of one answer per problem (None: not scored): their mean and AUROC against the
    samples' labels (score_statistics; no group spread: one answer per problem is no group)."""
    scores = torch.tensor([math.nan if r is None else r for r in rewards]).view(-1, 1)
    correct = torch.tensor(label_values([s["correct"] for s in samples])).view(-1, 1)
    stats = score_statistics(scores, correct, name)
    stats.pop(f"{name}/group_std")
    return stats


def verification_benchmark(
    spec: RunSpec, model, tokenizer, train: Dataset, heldout: Dataset, verifier: Labels, run_dir: Path
) -> list[Candidate]:
    """The run's verification benchmark (eval.verification_benchmark), from the cache or built now from `model`,
    which must be the initial policy; a copy goes to the run directory (python -m grpo_exp.evaluate reuses it).
    Every process calls it, and the main process writes. Whether the cache holds it is the main process's answer,
    its copy read there and sent to every process: a process deciding for itself (a node's own cache without it, or
    a file another job wrote in between) built the benchmark alone, its collectives without a partner."""
    cfg, max_new_tokens = spec.cfg, spec.eval_max_new_tokens
    bench_cfg = cfg.eval.verification_benchmark
    key = benchmark_key(bench_cfg, cfg.model, cfg.dataset, max_new_tokens, cfg.verifier.labels, verifier.answer_rule)
    cached = Path(cfg.cache_dir) / "verification_benchmark" / f"{key}.json"
    examples = from_main_process(lambda: load_benchmark(cached) if cached.is_file() else None)
    if examples is not None:
        log.info("Verification benchmark from the cache: %s", cached)
    else:  # every process answers a share of the problems
        problems = unseen_problems(cfg.dataset, bench_cfg.problems, train, heldout)
        examples = build_benchmark(policy_answers(model, tokenizer, spec), problems, verifier, bench_cfg)
        if is_main_process():
            save_benchmark(examples, cached)
    if is_main_process():  # written whole (save_benchmark): another process may be reading it (prepare_benchmark)
        save_benchmark(examples, run_dir / BENCHMARK_FILE)
    return examples


def benchmark_statistics(model, tokenizer, examples: list[Candidate], spec: RunSpec) -> dict[str, float]:
    """The model's own P(Yes) on the verification benchmark."""
    eval_cfg = spec.cfg.eval
    return score_benchmark(model, tokenizer, examples, eval_cfg.verification_benchmark, eval_cfg.batch_size)
