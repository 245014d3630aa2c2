"""HeldoutEval: the run's one held-out evaluation, shared by training (before, each validation, after) and
`grpo-exp evaluate`; it holds what it measured. BeforeTraining: the callback that measures before the first step.

Every method that takes a model runs on every process (each answers a share of the problems; the main process alone
asks the judge and writes files), on the model where it is: the caller hands it ready to generate
(HookedGRPOTrainer.policy_for_generation in training).
"""

import json
import logging
import math
import time
from pathlib import Path

from datasets import Dataset
from transformers import TrainerCallback

from grpo_exp.analysis.diagnosis.evidence import RunEvidence
from grpo_exp.analysis.diagnosis.rules import answer_collapse
from grpo_exp.errors import UserError
from grpo_exp.models import random_weights
from grpo_exp.run.build import RunParts
from grpo_exp.run.distributed import is_main_process
from grpo_exp.run.heldout import (
    EvalResult,
    SampledResult,
    benchmark_statistics,
    judge_statistics,
    policy_answers,
    run_heldout_accuracy,
    sampled_metrics,
    validation_metrics,
    verification_benchmark,
)
from grpo_exp.run.labels_check import check_labels_first
from grpo_exp.run.resolve import RunSpec
from grpo_exp.run.resume import Attempt, write_record
from grpo_exp.run.validation import untouched_rng
from grpo_exp.run_files import BENCHMARK_FILE, eval_file
from grpo_exp.schema import AlarmAction
from grpo_exp.trainer.levels import TaskLevels, accuracy_by_level
from grpo_exp.verification.benchmark import load_benchmark

log = logging.getLogger("grpo_exp.train")
WHEN_SHOWN = {"before_warmup": "before the warm-up"}  # a measurement's name in the log, where not "<when> training"
EPISODE_SUCCESS = "environment/success"  # grpo_exp.rollout.environment.environment_statistics: every environment's


class HeldoutEval:
    """Greedy held-out accuracy (with the tools, for rollout=multiturn); with self-verification or the judge on,
    their held-out measures too; the verification benchmark when it is on; pass@k / maj@k from sampled answers.
    `run_dir`: where eval_<when>.jsonl and the benchmark go."""

    def __init__(
        self,
        spec: RunSpec,
        parts: RunParts,
        tokenizer,
        heldout: Dataset,
        run_dir: Path,
        train: Dataset,
        levels: TaskLevels | None = None,
    ):
        """`levels` (dataset.levels): validations answer the held-out rows at the tasks' current levels, and raise
        the levels they measure as mastered."""
        self.spec, self.parts, self.tokenizer = spec, parts, tokenizer
        self.heldout, self.train, self.run_dir, self.levels = heldout, train, run_dir, levels
        self.before: EvalResult | None = None
        self.after: EvalResult | None = None
        self.benchmark = None  # the verification benchmark's examples, once built
        self.validated: tuple[int, EvalResult] | None = None  # the last validation's step and greedy answers
        self.seconds = 0.0  # spent before training (not training time)
        self.labels_check: list[str] | None = None  # probe.labels_check's findings before training (None: not run)

    # ---- training: before, validations, after -----------------------------------------------------------------

    def before_training(self, model, attempt: Attempt | None) -> None:
        """The verification benchmark (from the initial policy) and the accuracy before training; a resumed run
        takes its first attempt's (measured on the initial model)."""
        started = time.perf_counter()
        if self.spec.cfg.eval.verification_benchmark.enabled:
            self.prepare_benchmark(model)
        recorded = attempt.record.get("heldout_before") if attempt else None
        if recorded:
            self.before = EvalResult(**recorded)
        elif self.spec.cfg.eval.before:
            self.before = self.measure(model, "before")
            self._refuse_if_every_answer_is_cut(self.before.samples)
        self.seconds = time.perf_counter() - started

    def _refuse_if_every_answer_is_cut(self, samples: list[dict]) -> None:
        """Held-out answers of the initial model that all run to the token limit can be neither judged nor finished
        in training: refused before training (health.truncation=off trains anyway). Counted by re-tokenising each
        answer's text. A random model (model=tiny, shape) is exempt: it never ends an answer; multi-turn answers are
        bounded per turn."""
        cfg = self.spec.cfg
        if cfg.health.truncation is AlarmAction.off or random_weights(cfg.model) or self.spec.multiturn:
            return
        limit = self.spec.eval_max_new_tokens
        tokens = [len(self.tokenizer(s["completion"], add_special_tokens=False)["input_ids"]) for s in samples]
        if tokens and min(tokens) >= limit:
            key = "eval.max_new_tokens" if cfg.eval.max_new_tokens else "trainer.max_completion_length"
            raise UserError(
                f"every one of the {len(tokens)} held-out answers of the initial model ran to the limit of {limit} "
                f"tokens ({key}={limit}) without ending: none can be judged, and training would cut every "
                f"completion. Raise {key}, or set health.truncation=off to train anyway"
            )

    def problem_rows(self) -> list[int]:
        """What a validation answers: the first eval.every_problems held-out rows (at the current levels)."""
        rows = self.levels.heldout_rows() if self.levels is not None else range(len(self.heldout))
        return list(rows)[: self.spec.cfg.eval.every_problems or None]

    @property
    def problems(self) -> Dataset:
        return self.heldout.select(self.problem_rows())

    def validate(self, model, step: int) -> dict[str, float]:
        """A validation's metrics on `problems` (greedy; pass@k / maj@k with eval.every_samples)."""
        problems = self.problems
        result = run_heldout_accuracy(model, self.tokenizer, problems, self.spec, self.parts, None)
        self.validated = (step, result)
        metrics = self._scored(result.samples, step)
        if step > 0:
            self._warn_of_collapse(result.samples, step)
        return metrics | self._sampled_metrics(model, problems)

    def _sampled_metrics(self, model, problems: Dataset) -> dict[str, float]:
        """pass@k / maj@k from eval.every_samples sampled answers to `problems` (none without it)."""
        samples = self.spec.cfg.eval.every_samples
        if not samples:
            return {}
        return {f"heldout/{key}": value for key, value in self.sampled(model, problems, samples).metrics.items()}

    def _warn_of_collapse(self, samples: list[dict], step: int) -> None:
        """A validation's answers collapsed to one (the diagnosis rule answer_collapse), said when it is seen."""
        found = answer_collapse(RunEvidence(config=self.spec.saved_config), samples)
        if found is not None and is_main_process():
            log.warning("Validation at step %d: %s", step, "\n".join(found.lines()))

    def initial(self, model) -> dict[str, float]:
        """The initial model's validation: the answers of the evaluation before training to these problems, when
        it ran (greedy: the same answers, up to the padding of a last, partial batch), scored as validations are; with
        eval.every_samples, only the sampled answers are drawn now."""
        if self.before is None:
            metrics = self.validate(model, 0)
            self._refuse_if_every_answer_is_cut(self.validated[1].samples)
            return metrics
        problems = self.problems  # before _scored, which may raise the tasks' levels
        metrics = self._scored([self.before.samples[row] for row in self.problem_rows()], 0)
        return metrics | self._sampled_metrics(model, problems)

    def _scored(self, samples: list[dict], step: int) -> dict[str, float]:
        """A validation's metrics; with dataset.levels, the levels raised where mastered, and each task's level."""
        metrics = validation_metrics(samples, self.parts)
        if self.levels is not None:
            self.levels.raise_levels(samples, step)
            metrics |= self.levels.metrics()
        return metrics

    def after_training(self, model, step: int) -> None:
        """The accuracy after training; a validation at this step on every held-out problem has answered already."""
        validated = self.validated
        reuse = validated is not None and validated[0] == step and len(self.problem_rows()) == len(self.heldout)
        self.after = self.measure(model, "after", answered=validated[1] if reuse else None)

    # ---- any model --------------------------------------------------------------------------------------------

    def measure(self, model, when: str, answered: EvalResult | None = None) -> EvalResult:
        """Every held-out problem answered greedily and scored, with the measures the run has on; each problem's
        completion and label go to eval_<when>.jsonl. answered: the same model's greedy answers to all of them,
        already measured, taken instead of answering again."""
        spec, parts = self.spec, self.parts
        result = answered or self.greedy(model, f"held-out eval ({when})")
        shown = WHEN_SHOWN.get(when, f"{when} training")  # what the log lines say
        log.info("Held-out accuracy %s: %.3f (%d/%d)", shown, result.accuracy, result.correct, result.scored)
        if result.rollout:
            log.info("Held-out trajectories %s: %s", shown, _rounded(result.rollout))
        if EPISODE_SUCCESS in result.rollout:  # a run of environments: their episodes' success is what it learns
            won, played = round(result.rollout[EPISODE_SUCCESS] * len(result.samples)), len(result.samples)
            log.info("Held-out episodes won %s: %.3f (%d/%d)", shown, result.rollout[EPISODE_SUCCESS], won, played)
        selfverify = parts.tasks.get("selfverify")
        if selfverify is not None:
            answers = policy_answers(model, self.tokenizer, spec)
            result.verification = selfverify.heldout_metrics(
                answers, model, self.tokenizer, self.heldout, spec.cfg.eval.batch_size
            )
            log.info("Held-out self-verification %s: %s", shown, result.verification)
        if self.benchmark is not None:
            measured = self.benchmark_metrics(model)
            result.verification |= measured
            log.info("Verification benchmark %s: %s", shown, _rounded(measured))
        if not is_main_process():  # the judge's requests and the files: once
            return result
        if parts.judge is not None:
            result.judge = judge_statistics(parts.judge, result.samples)
            log.info("Held-out judge %s: %s", shown, _rounded(result.judge))
        with (self.run_dir / eval_file(when)).open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(sample) + "\n" for sample in result.samples)
        return result

    def greedy(self, model, desc: str | None = "greedy") -> EvalResult:
        """Every held-out problem answered greedily and scored, nothing else measured."""
        return run_heldout_accuracy(model, self.tokenizer, self.heldout, self.spec, self.parts, desc)

    def prepare_benchmark(self, model) -> None:
        """The verification benchmark: the run directory's own set when it has one (its initial policy's answers),
        else from the cache or built now from `model`, which must then be the initial policy."""
        own = self.run_dir / BENCHMARK_FILE
        if own.is_file():
            self.benchmark = load_benchmark(own)
            return
        self.benchmark = verification_benchmark(
            self.spec, model, self.tokenizer, self.train, self.heldout, self.parts.verifier, self.run_dir
        )

    def benchmark_metrics(self, model) -> dict[str, float]:
        """The model's own P(Yes) on the verification benchmark (prepare_benchmark first)."""
        return benchmark_statistics(model, self.tokenizer, self.benchmark, self.spec)

    def sampled(self, model, problems: Dataset, samples: int) -> SampledResult:
        """pass@1..k and maj@k from `samples` answers per problem at eval.temperature, and those answers."""
        spec = self.spec
        return sampled_metrics(
            model,
            self.tokenizer,
            problems,
            self.parts.verifier,
            samples,
            spec.cfg.eval.temperature,
            spec.eval_max_new_tokens,
            spec.cfg.eval.batch_size,
            self.parts.rollout,
            prepacked=spec.cfg.eval.prepacked,
        )

    def accuracy_before(self) -> float | None:
        """The console's held-out measure before training: the accuracy, or a run of environments' episodes won."""
        if self.before is not None and EPISODE_SUCCESS in self.before.rollout:
            return self.before.rollout[EPISODE_SUCCESS]
        return _accuracy(self.before)

    def summary(self) -> dict:
        """For summary.json: the accuracy and every other held-out measure, before and after."""
        summary = {"heldout_accuracy_before": _accuracy(self.before), "heldout_accuracy_after": _accuracy(self.after)}
        summary |= {"labels": self.spec.cfg.verifier.labels, "answer": self.parts.verifier.answer_rule}
        environment = self.spec.cfg.rollout.environment
        if environment is not None:  # its episodes are scored by the environment, not by labels
            shown = environment if isinstance(environment, str) else ", ".join(map(str, environment.values()))
            summary["scored_by"] = f"the environment ({shown}): episodes won"
        if self.labels_check is not None:
            summary["labels_check"] = self.labels_check
        for when, result in (("before", self.before), ("after", self.after)):
            if result is not None:
                measured = result.verification | result.rollout | result.judge | result.tasks
                summary |= {f"heldout_{k.replace('/', '_')}_{when}": v for k, v in measured.items()}
                summary[f"heldout_lenient_accuracy_{when}"] = result.lenient_accuracy
        tasks = sorted({key.split("/", 1)[1] for r in (self.before, self.after) if r for key in r.tasks if "/" in key})
        if tasks:  # a reasoning-gym mix: heldout_accuracy_<task>_before / _after
            summary["heldout_tasks"] = tasks
        if self.levels is not None:  # each task's level reached, and the accuracy at every level
            summary |= {f"level_{task}_final": level for task, level in sorted(self.levels.current.items())}
            for when, result in (("before", self.before), ("after", self.after)):
                accuracies = accuracy_by_level(result.samples) if result is not None else {}
                summary |= {f"heldout_accuracy_{task}_level{lv}_{when}": a for (task, lv), a in accuracies.items()}
        if environment is not None:  # games won have no reference answer: no format/content split
            return summary
        return summary | format_and_content(summary)


class OnPolicy:
    """HeldoutEval on the trainer's live policy, made ready to generate for each measurement (unwrapped as TRL
    unwraps it; under ZeRO-3 gathered once): what the training callbacks call."""

    def __init__(self, trainer, evaluation: HeldoutEval):
        self.trainer, self.evaluation = trainer, evaluation

    def validate(self) -> dict[str, float]:
        with self.trainer.policy_for_generation() as policy:
            return self.evaluation.validate(policy, self.trainer.state.global_step)

    def initial(self) -> dict[str, float]:
        with self.trainer.policy_for_generation() as policy:  # scorer=self scores with the policy
            return self.evaluation.initial(policy)

    def after_training(self) -> None:
        with self.trainer.policy_for_generation() as policy:
            self.evaluation.after_training(policy, self.trainer.state.global_step)


class BeforeTraining(TrainerCallback):
    """When training begins, the model is where it trains (on its device, wrapped or sharded by accelerate), so that
    every process can evaluate a share of the problems: the evaluation before training, then the attempt's record
    (what a resumed attempt needs: `record` and the accuracy before)."""

    def __init__(self, on_policy: OnPolicy, attempt: Attempt | None, record: dict):
        self.on_policy, self.attempt, self.record = on_policy, attempt, record

    def on_train_begin(self, args, state, control, **kwargs):
        evaluation = self.on_policy.evaluation
        with untouched_rng(), self.on_policy.trainer.policy_for_generation() as policy:
            evaluation.before_training(policy, self.attempt)
            if state.global_step == 0:  # a resumed run was checked at its start
                evaluation.labels_check = check_labels_first(evaluation, policy, evaluation.run_dir)
        if is_main_process():
            before = evaluation.before and evaluation.before.recorded()
            write_record(evaluation.run_dir, self.record | {"heldout_before": before})


def format_and_content(summary: dict) -> dict:
    """The held-out gain split in two: content, the gain of the lenient accuracy (the reference anywhere in the final
    sentence); format, the rest of the gain of the run's own accuracy. Empty without both ends."""
    ends = [
        summary.get(f"heldout_{kind}_{when}")
        for kind in ("accuracy", "lenient_accuracy")
        for when in ("before", "after")
    ]
    if any(end is None or math.isnan(end) for end in ends):
        return {}
    strict, lenient = ends[1] - ends[0], ends[3] - ends[2]
    return {"heldout_gain_content": lenient, "heldout_gain_format": strict - lenient}


def _accuracy(result: EvalResult | None) -> float | None:
    return result.accuracy if result else None


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 3) for key, value in values.items()}
