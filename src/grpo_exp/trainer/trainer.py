"""GRPOExpTrainer: TRL's GRPOTrainer plus group statistics and the self-verification task, as hooks only.

TRL's sampling and loss are untouched; through the seam (grpo_exp.trainer.seam):
- before generation, when `selfverify` is in the reward mix, some groups of the batch are replaced by
  verification prompts built from recent on-policy samples (grpo_exp.verification.task), per the schedule;
- after scoring, the ScoredBatch (prompts, completions, per-component rewards, advantages) is summarised per
  group by grpo_exp.stats; the scalars join TRL's own metrics (averaged and logged each logging step, reaching
  the tracker through TRL's report_to and metrics.jsonl alike). Histograms of the per-group reward, and every
  `stats.table_every` steps a few whole groups, go to the callables the run hands in (log_histograms,
  log_samples: the tracker and samples.jsonl). Labelled generation samples feed the self-verification buffer.
"""

import math
import time
from collections.abc import Callable

import torch
from accelerate.utils import gather_object

from grpo_exp.answers import vote_key
from grpo_exp.config_rules import OnlyWith
from grpo_exp.generation import generate_completions
from grpo_exp.rewards.components import graded_components
from grpo_exp.rollout.environment import environment_statistics
from grpo_exp.rollout.flow import broadcast_to_turns, trajectory_statistics
from grpo_exp.stats import (
    final_answers,
    group_statistics,
    group_std,
    label_values,
    per_task_means,
    score_statistics,
)
from grpo_exp.text import completion_text
from grpo_exp.trainer.curriculum import DifficultyPool
from grpo_exp.trainer.levels import LevelChooser
from grpo_exp.trainer.scored_batch import TASK_COLUMNS, ScoredBatch
from grpo_exp.trainer.seam import HookedGRPOTrainer
from grpo_exp.verification.labels import Labels
from grpo_exp.verification.p_yes import verdict_log_probabilities, yes_no_token_ids
from grpo_exp.verification.selfverify import NO, YES
from grpo_exp.verification.task import VERIFY, Ranks, SelfVerificationTask


class GRPOExpTrainer(HookedGRPOTrainer):
    def __init__(
        self,
        *args,
        verifier: Labels,
        stats_cfg,
        selfverify: SelfVerificationTask | None = None,
        curriculum: DifficultyPool | LevelChooser | None = None,
        log_histograms: Callable[[int, dict], None] | None = None,
        log_samples: Callable[[int, list[dict]], None] | None = None,
        **kwargs,
    ):
        """log_histograms(step, {name: values}) and log_samples(step, rows): where the per-group histograms and
        the sampled groups go (the run's tracker and samples.jsonl: grpo_exp.run.sample_log); None: nowhere."""
        super().__init__(*args, **kwargs)
        self.verifier = verifier
        self.stats_cfg = stats_cfg
        self.selfverify = selfverify
        self.curriculum = curriculum
        self.log_histograms, self.log_samples = log_histograms, log_samples
        # a reasoning-gym mix (dataset.tasks): statistics per task, of each task a step samples
        columns = self.train_dataset.column_names
        self.task_mix = "task_name" in columns and len(set(self.train_dataset["task_name"])) > 1
        self.answer_watchers: list[Callable[[list, list], None]] = []

    def watch_answers(self, watcher: Callable[[list, list], None]) -> None:
        """`watcher(answers, references)` sees each generation batch's final answers and references (vote keys;
        every process's): the answer-collapse alarm (grpo_exp.run.health)."""
        self.answer_watchers.append(watcher)

    @property
    def wants_scored_batch(self) -> bool:
        return self.stats_cfg.enabled or self.selfverify is not None or self.curriculum is not None

    def before_generation(self, inputs: list[dict]) -> list[dict]:
        if self.curriculum is not None:
            inputs = self._from_curriculum(inputs)
        if self.selfverify is None:
            return inputs
        rows, metrics = self.selfverify.mix_in(
            inputs, self.num_generations, self.state.global_step + 1, self._sample_answers, self._ranks
        )
        for key, value in metrics.items():
            self.record_metric(key, value)
        return rows

    def auxiliary_loss(self, model) -> torch.Tensor | None:
        """(selfverify objective=supervised) the verdict loss of this step's verification examples, once per
        generated batch."""
        task = self.selfverify
        if task is None or not task.pending_verdict_examples:
            return None
        examples, task.pending_verdict_examples = task.pending_verdict_examples, []
        weights, task.pending_verdict_weights = task.pending_verdict_weights, []
        tokenizer = self.processing_class
        ids = yes_no_token_ids(tokenizer, YES, NO)
        log_p = verdict_log_probabilities(model, tokenizer, task.conversations(examples), *ids)
        label_is_no = torch.tensor([0 if c.correct else 1 for c in examples], device=log_p.device)
        cross_entropy = -log_p.gather(1, label_is_no[:, None]).squeeze(1)
        if any(weights):
            self.record_metric("selfverify/verdict_loss", cross_entropy.mean().item())
        weighted = (cross_entropy * torch.tensor(weights, device=log_p.device)).sum()
        return task.cfg.supervised_weight * weighted

    def loss_token_mask(self, rows, completion_ids, completion_mask):
        """Self-verification (loss_on=verdict): a verification completion counts up to its verdict."""
        if self.selfverify is None:
            return None
        tokenizer = self.processing_class
        mask = self.selfverify.verdict_loss_mask(
            rows, completion_ids, completion_mask, lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        )
        if mask is None:
            return None
        verify = torch.tensor([row.get("task") == VERIFY for row in rows])
        if verify.any():
            counted = (completion_mask * mask.to(completion_mask))[verify].sum(dim=1).float()
            self.record_metric("selfverify/loss_tokens", counted.mean().item())
        return mask

    def _from_curriculum(self, inputs: list[dict]) -> list[dict]:
        """This process's share of the step's groups, drawn by the curriculum for every process's groups together
        (the same draw on each: one seed, one pool), each group's row repeated G times as TRL's sampler repeats it."""
        size, ranks = self.num_generations, self._ranks
        chosen = self.curriculum.choose(len(inputs) // size * ranks.count, self.state.global_step + 1)
        rows = [self.train_dataset[row] for row in chosen[ranks.index :: ranks.count]]
        for key, value in self.curriculum.metrics().items():
            self.record_metric(key, value)
        return [row for row in rows for _ in range(size)]

    def _observe_for_curriculum(self, batch: ScoredBatch, correct: torch.Tensor) -> None:
        """Each group's pass rate (every process's groups: the same on each) into the pool, its histogram logged."""
        questions = [row["question"] for row in batch.rows[:: batch.group_size]]
        self.curriculum.observe(questions, torch.nanmean(batch.grouped(correct), dim=1).tolist())
        rates = self.curriculum.pass_rates()  # none when only the task levels choose
        if rates and self.log_histograms is not None and self.accelerator.is_main_process:
            self.log_histograms(self.state.global_step + 1, {"curriculum/pass_rate_hist": rates})

    def after_scoring(self, batch: ScoredBatch) -> None:
        started = time.perf_counter()
        correct = self._correctness(batch)
        if self.curriculum is not None:
            self._observe_for_curriculum(batch, correct)
        if self.stats_cfg.enabled:
            self._record_group_statistics(batch, correct)
        if self.selfverify is not None:
            self._record_self_verification(batch, correct)
        if self.answer_watchers:
            answers = final_answers(batch.texts, self.verifier.answer)
            references = [None if r["solution"] is None else vote_key(str(r["solution"])) for r in batch.rows]
            for watch in self.answer_watchers:
                watch(answers, references)
        # Our own cost, logged beside TRL's step_time so that the overhead is always visible.
        self.record_metric("timing/group_stats_s", time.perf_counter() - started)

    def _correctness(self, batch: ScoredBatch) -> torch.Tensor:
        """The run's correctness label (verifier.labels) of every completion: 1, 0, or NaN (cannot be judged)."""
        solutions = [None if r["solution"] is None else str(r["solution"]) for r in batch.rows]
        labels = self.verifier(batch.texts, solutions, [r["task_entry"] for r in batch.rows])
        return torch.tensor(label_values(labels))

    def _record_group_statistics(self, batch: ScoredBatch, correct: torch.Tensor) -> None:
        size, texts = batch.group_size, batch.texts
        stats = group_statistics(
            batch.grouped(batch.rewards),
            batch.reward_names,
            batch.grouped(batch.total),
            batch.grouped(batch.advantages),
            batch.grouped(correct),
            [texts[i : i + size] for i in range(0, len(texts), size)],
            batch.grouped(batch.lengths),
            self.verifier.answer,
        )
        tasks = [row["task_name"] for row in batch.rows]  # a reasoning-gym mix: each task's accuracy and reward
        stats |= per_task_means(tasks, correct.tolist(), "tasks/accuracy", self.task_mix)
        stats |= per_task_means(tasks, batch.total.tolist(), "tasks/reward", self.task_mix)
        if batch.trajectories is not None:
            stats |= trajectory_statistics(batch.rows, batch.total.tolist(), self.verifier.answer)
        stats |= environment_statistics(batch.rows)  # on either tool-calling loop
        for name in graded_components() & set(batch.reward_names):  # is the graded score a signal of correctness?
            column = batch.reward_names.index(name)
            scored = batch.rewards[:, column].masked_fill(batch.imputed[:, column], math.nan)  # failures: missing
            stats |= score_statistics(batch.grouped(scored), batch.grouped(correct), name)
        for key, value in stats.items():
            self.record_metric(key, value)
        if self.accelerator.is_main_process:
            self._log_groups(self.state.global_step + 1, batch, correct)  # the optimisation step this batch feeds

    # ---- self-verification ---------------------------------------------------------------------------------

    def _record_self_verification(self, batch: ScoredBatch, correct: torch.Tensor) -> None:
        """Verdict metrics of this batch's verification groups; its generation groups join the candidates."""
        size, rows = batch.group_size, batch.rows
        verify = [i for i, row in enumerate(rows) if row["task"] == VERIFY]
        if verify:
            texts, labels = [batch.texts[i] for i in verify], [rows[i]["verify_label"] for i in verify]
            for key, value in self.selfverify.verdict_metrics(texts, labels).items():
                self.record_metric(key, value)
        starts = [s for s in range(0, len(batch.texts), size) if rows[s]["task"] != VERIFY]
        texts = [t for s in starts for t in batch.texts[s : s + size]]
        labels = [None if math.isnan(v) else v == 1.0 for s in starts for v in correct[s : s + size].tolist()]
        self.selfverify.observe_step([rows[s]["question"] for s in starts], texts, labels, size, self._ranks)

    @property
    def _ranks(self) -> Ranks:
        return Ranks(self.accelerator.process_index, self.accelerator.num_processes, gather_object)

    def _sample_answers(self, prompts: list) -> list[str]:
        """verify_only: the current policy's answers to judge (sampled as in training, not trained on)."""
        max_new_tokens, temperature = self.sampling_settings
        return generate_completions(
            self.model, self.processing_class, prompts, max_new_tokens, len(prompts), None, temperature
        )

    # ---- sampled groups: histograms and tables (the tracker's, samples.jsonl) ----------------------------------

    def _log_groups(self, step: int, batch: ScoredBatch, correct: torch.Tensor) -> None:
        size, texts, total = batch.group_size, batch.texts, batch.total
        if self.log_histograms is not None:
            grouped_total = batch.grouped(total)
            self.log_histograms(
                step,
                {
                    "groups/reward_mean_hist": _histogram_values(torch.nanmean(grouped_total, dim=1)),
                    "groups/reward_std_hist": _histogram_values(group_std(grouped_total)),
                },
            )
        if (step - 1) % self.stats_cfg.table_every or self.log_samples is None:
            return
        rows = []
        trajectory_columns = _trajectory_columns(batch)
        for group in range(min(self.stats_cfg.table_groups, len(texts) // size)):
            for i in range(group * size, (group + 1) * size):
                rows.append(
                    {
                        "step": step,
                        "group": group,
                        "task": batch.rows[i]["task"] or "generate",
                        **{key: batch.rows[i][key] for key in TASK_COLUMNS if batch.rows[i].get(key) is not None},
                        "prompt": completion_text(batch.prompts[i]),
                        "completion": texts[i],
                        "answer": self.verifier.answer(texts[i]),
                        "reference": _reference(batch.rows[i]["solution"]),
                        **{f"reward/{n}": _float(batch.rewards[i, j]) for j, n in enumerate(batch.reward_names)},
                        "reward": _float(total[i]),
                        "advantage": _float(batch.advantages[i]),
                        "correct": _float(correct[i]),
                        **trajectory_columns[i],
                    }
                )
        if rows:
            self.log_samples(step, rows)


def _trajectory_columns(batch: ScoredBatch) -> list[dict]:
    """Multi-turn: each whole trajectory, its turns, and the advantage each of its turns was trained with."""
    if batch.trajectories is None:
        return [{}] * len(batch.texts)
    rows = batch.rows
    per_turn = broadcast_to_turns([_float(a) for a in batch.advantages], [r["num_turns"] for r in rows])
    per_turn = [
        own if row.get("turn_advantages") is None else row["turn_advantages"]
        for own, row in zip(per_turn, rows, strict=True)
    ]
    return [
        {
            "trajectory": trajectory,
            "turns": row["num_turns"],
            "tool_calls": row["tool_calls"],
            "tool_errors": row["tool_errors"],
            "turn_advantages": advantages,
        }
        for trajectory, row, advantages in zip(batch.trajectories, rows, per_turn, strict=True)
    ]


def _reference(solution) -> str | None:
    return None if solution is None else str(solution)


def _histogram_values(values: torch.Tensor):
    """Rounded: values a few ulps apart (float noise) make numpy refuse 64 bins over that range."""
    return torch.round(values.nan_to_num(), decimals=6).numpy()


def _float(value: torch.Tensor) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("stats.table_every", "stats.table_groups"),
        lambda cfg: cfg.stats.enabled,
        "with the group statistics (stats.enabled=true)",
        lambda cfg: "stats.enabled=false",
        "set stats.enabled=true too",
    ),
)
