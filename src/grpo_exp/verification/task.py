"""The self-verification task as one object, used by training (every step) and by held-out evaluation.

Its pipeline (grpo_exp.verification.selfverify, pure functions): labelled on-policy answers -> candidates ->
filter -> balanced, diverse selection -> verification prompts; the policy's verdicts -> parsed -> metrics;
a P(Yes) scorer's probabilities -> AUROC / Brier / ECE.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from datasets import Dataset
from omegaconf import DictConfig

from grpo_exp.errors import UserError
from grpo_exp.generation import PolicyAnswers
from grpo_exp.schema import (
    SelfVerifyBalance,
    SelfVerifyObjective,
    SelfVerifySchedule,
    VerdictLossTokens,
    ZeroVarianceGroups,
)
from grpo_exp.text import tokens_covering
from grpo_exp.verification.labels import Labels
from grpo_exp.verification.p_yes import PYesScorer, policy_p_yes
from grpo_exp.verification.selfverify import (
    YES,
    Candidate,
    candidates_from_groups,
    filter_candidates,
    judgement_metrics,
    matched_pairs,
    parse_judgement,
    probability_metrics,
    select_samples,
    shown_answer,
    verdict_span,
    verification_prompt,
)
from grpo_exp.verification.task_score import ENTRY, entries_of

GENERATE, VERIFY = "generate", "verify"  # a row's task: answer the problem, or judge an answer to it


@dataclass(frozen=True)
class Ranks:
    """This process among those that share a step: `gather(items)` returns every process's list, concatenated
    in rank order, on every process (one process: the list itself)."""

    index: int = 0
    count: int = 1
    gather: Callable[[list], list] = list


class SelfVerificationTask:
    def __init__(self, cfg: DictConfig, verifier: Labels, p_yes: PYesScorer | None, seed: int):
        """cfg: reward.components.selfverify; verifier: the run's correctness labels; p_yes: the scorer whose
        P(Yes) on the selected answers is measured every step (None: not measured)."""
        self.cfg, self.verifier, self.p_yes, self.seed = cfg, verifier, p_yes, seed
        self.candidates: deque[Candidate] = deque(maxlen=cfg.buffer_size)
        self._problems_seen = 0
        # objective=supervised: this process's share of the step's verification examples, for the trainer's
        # auxiliary verdict loss, each with its weight in the step's mean (see mix_in)
        self.pending_verdict_examples: list[Candidate] = []
        self.pending_verdict_weights: list[float] = []

    @property
    def supervised_objective(self) -> bool:
        return self.cfg.objective is SelfVerifyObjective.supervised

    def conversations(self, chosen: list[Candidate]) -> list[list[dict[str, str]]]:
        return [verification_prompt(c, self.cfg.template, self.cfg.show) for c in chosen]

    # ---- training -------------------------------------------------------------------------------------------

    def wanted_groups(self, groups: int, step: int) -> int:
        """How many of a batch's groups the schedule turns into verification groups at this (1-based) step (with
        objective=supervised: how many examples the verdict loss takes)."""
        schedule = self.cfg.schedule
        pairs = self.cfg.balance is SelfVerifyBalance.pairs
        if schedule is SelfVerifySchedule.joint:
            return 2 * self.cfg.pairs_per_step if pairs else max(1, round(self.cfg.fraction * groups))
        if schedule is SelfVerifySchedule.interleave and step % self.cfg.every:
            return 0
        return 2 * (groups // 2) if pairs else groups

    def select(self, wanted: int, step: int) -> tuple[list[Candidate], dict[str, float]]:
        """This step's verification examples from the buffer, and the selection's metrics."""
        kept, removed = filter_candidates(list(self.candidates), self.cfg.drop_no_answer, self.cfg.drop_all_wrong)
        seed = self.seed + step - 1
        if self.cfg.balance is SelfVerifyBalance.pairs:
            chosen = matched_pairs(kept, wanted // 2, seed)
        else:
            chosen = select_samples(kept, wanted, self.cfg.yes_share, self.cfg.per_problem, seed)
        metrics = {
            "selfverify/candidates": float(len(self.candidates)),
            "selfverify/removed_no_answer": float(removed["no_answer"]),
            "selfverify/removed_all_wrong": float(removed["all_wrong"]),
            "selfverify/groups": float(len(chosen)),
            # balance=pairs: 1 when the buffer held fewer problems with mixed results than the step wanted
            "selfverify/short": float(len(chosen) < wanted),
        }
        if chosen:
            metrics["selfverify/yes_share"] = sum(c.correct for c in chosen) / len(chosen)
            metrics |= self.p_yes_metrics(chosen, "selfverify/p_yes")
        return chosen, metrics

    def mix_in(
        self, rows: list[dict], size: int, step: int, sample: Callable[[list], list[str]], ranks: Ranks = Ranks()
    ) -> tuple[list[dict], dict[str, float]]:
        """This process's rows with its last groups replaced by its share of the step's verification prompts, as
        the schedule says, and the metrics of the selection. `sample(prompts)` answers prompts with the current
        policy (verify_only: the answers to judge are sampled first, not trained on).

        The step's examples are chosen for all processes' groups together, from one buffer that every process
        holds alike (each observes every process's groups), with one seed: every process chooses the same, then
        takes every `ranks.count`-th, starting at its own index."""
        rows = [{**row, "task": GENERATE, "verify_label": None, "pass_rate": None} for row in rows]
        self.pending_verdict_examples, self.pending_verdict_weights = [], []
        groups = len(rows) // size
        wanted = self.wanted_groups(groups * ranks.count, step)
        if self.cfg.schedule is SelfVerifySchedule.verify_only:
            problems = rows[::size]
            prompts = [row["prompt"] for row in problems for _ in range(size)]
            texts = sample(prompts)
            solutions = [str(row["solution"]) for row in problems for _ in range(size)]
            entries = [row.get(ENTRY) for row in problems for _ in range(size)]
            labels = self.verifier(texts, solutions, entries)
            self.observe_step([row["question"] for row in problems], texts, labels, size, ranks)
        if not wanted:
            return rows, {}
        chosen, metrics = self.select(wanted, step)
        mine = chosen[ranks.index :: ranks.count]
        if self.supervised_objective:  # the verdict loss takes them; the GRPO batch stays all generation
            if chosen:
                # Weighted so that the processes' gradients, averaged, are those of the step's mean; a process
                # with no share still runs the loss's forward (weight 0), as every process must under DDP.
                self.pending_verdict_examples = mine or chosen[:1]
                self.pending_verdict_weights = [ranks.count / len(chosen)] * len(mine) or [0.0]
            return rows, metrics
        for offset, candidate in enumerate(mine):
            group = groups - len(mine) + offset
            # every column of the generation row it replaces (None: TRL hands the rewards each column of every row)
            row = dict.fromkeys(rows[group * size]) | {
                "prompt": verification_prompt(candidate, self.cfg.template, self.cfg.show),
                "question": candidate.question,
                "solution": None,
                "task": VERIFY,
                "verify_label": candidate.label,
                "pass_rate": candidate.pass_rate,
            }
            rows[group * size : (group + 1) * size] = [dict(row) for _ in range(size)]
        return rows, metrics

    def observe(self, questions: list[str], texts: list[str], labels: list[bool | None], size: int) -> None:
        """Labelled answers of generation groups (one problem per group of `size`) join the candidate buffer."""
        found = candidates_from_groups(
            questions, texts, labels, size, self.verifier.answer, first_problem=self._problems_seen
        )
        self._problems_seen += len(questions)
        self.candidates.extend(found)

    def observe_step(
        self, questions: list[str], texts: list[str], labels: list[bool | None], size: int, ranks: Ranks
    ) -> None:
        """observe() every process's generation groups of this step, in rank order, on every process."""
        groups = [
            (q, texts[i * size : (i + 1) * size], labels[i * size : (i + 1) * size]) for i, q in enumerate(questions)
        ]
        everyone = ranks.gather(groups)
        self.observe(
            [q for q, _, _ in everyone],
            [t for _, group, _ in everyone for t in group],
            [label for _, _, group in everyone for label in group],
            size,
        )

    def verdict_loss_mask(
        self,
        rows: list[dict],
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        decode: Callable[[list[int]], str],
    ) -> torch.Tensor | None:
        """loss_on=verdict: which completion tokens the loss counts (1) for these rows: a verification
        completion's tokens up to the end of its verdict, every other row's all. None when the settings never cut
        (the same answer in every process, whatever rows it holds)."""
        if self.cfg.loss_on is not VerdictLossTokens.verdict or self.supervised_objective:
            return None
        mask = torch.ones_like(completion_mask)
        for i in (i for i, row in enumerate(rows) if row.get("task") == VERIFY):
            ids = completion_ids[i][completion_mask[i].bool()].tolist()
            text = decode(ids)
            _, end = verdict_span(text, self.cfg.strict_verdict)
            if end is not None:
                mask[i, tokens_covering(ids, text, end, decode) :] = 0
        return mask

    def verdict_metrics(self, texts: list[str], labels: list[str], prefix: str = "selfverify") -> dict[str, float]:
        """Accuracy, precision / recall / F1 of "Yes" and the malformed share of verdicts against their labels."""
        predicted = [parse_judgement(text, self.cfg.strict_verdict) for text in texts]
        return judgement_metrics(
            [None if p is None else p == YES for p in predicted], [label == YES for label in labels], prefix
        )

    def p_yes_metrics(self, chosen: list[Candidate], prefix: str, scorer: PYesScorer | None = None) -> dict[str, float]:
        """AUROC / Brier / ECE of a scorer's P(Yes) on the chosen answers (one forward pass)."""
        scorer = scorer or self.p_yes
        if scorer is None:
            return {}
        scores = scorer([c.question for c in chosen], [shown_answer(c, self.cfg.show) for c in chosen])
        return probability_metrics(scores, [c.correct for c in chosen], prefix)

    # ---- held-out evaluation ---------------------------------------------------------------------------------

    def heldout_metrics(
        self,
        answers: PolicyAnswers,
        model,
        tokenizer,
        dataset: Dataset,
        batch_size: int,
        samples: int = 2,
        temperature: float = 1.0,
    ) -> dict[str, float]:
        """How well the policy judges its own answers on held-out problems.

        Answers are sampled (`samples` per problem, as the run answers: `answers`) and labelled by the run's labels;
        a balanced, diverse set of them (the training task's own selection, all-wrong problems kept) is put to the
        policy as verification prompts, answered greedily. Reports verdict accuracy (50% is chance on a balanced
        set), precision / recall / F1 of "Yes", and AUROC / Brier / ECE of the policy's own P(Yes) (`model`'s).
        """
        torch.manual_seed(self.seed)
        prompts = [p for p in dataset["prompt"] for _ in range(samples)]
        texts = answers(prompts, temperature, "own answers")
        solutions = [s for s in dataset["solution"] for _ in range(samples)]
        labels = self.verifier(texts, solutions, entries_of(dataset, samples))
        candidates = candidates_from_groups(dataset["question"], texts, labels, samples, self.verifier.answer)
        kept, _ = filter_candidates(candidates, drop_no_answer=True, drop_all_wrong=False)
        chosen = select_samples(kept, len(dataset), 0.5, samples, self.seed)
        if not chosen:
            return {}
        conversations = self.conversations(chosen)
        verdicts = answers(conversations, 0.0, "verdicts")
        actual = [c.correct for c in chosen]
        return (
            {"verify/examples": len(chosen), "verify/yes_share": sum(actual) / len(actual)}
            | self.verdict_metrics(verdicts, [c.label for c in chosen], "verify")
            | self.p_yes_metrics(chosen, "verify/p_yes", policy_p_yes(model, tokenizer, batch_size))
        )


def check_task(task_cfg: DictConfig, trainer_cfg: DictConfig, algorithm_cfg: DictConfig) -> None:
    """What the schema cannot check alone: the task's settings against the trainer's and the estimator's."""
    groups = trainer_cfg.prompts_per_step
    joint_grpo = task_cfg.schedule is SelfVerifySchedule.joint and task_cfg.objective is SelfVerifyObjective.grpo
    if joint_grpo and task_cfg.balance is SelfVerifyBalance.pairs and 2 * task_cfg.pairs_per_step >= groups:
        raise UserError(
            f"reward.components.selfverify.pairs_per_step={task_cfg.pairs_per_step} takes "
            f"{2 * task_cfg.pairs_per_step} verification groups per step (schedule=joint), which leaves no "
            f"generation group of trainer.prompts_per_step={groups}: raise prompts_per_step above "
            f"{2 * task_cfg.pairs_per_step} or lower pairs_per_step"
        )
    if task_cfg.objective is SelfVerifyObjective.grpo and task_cfg.balance is SelfVerifyBalance.pairs and groups < 2:
        raise UserError(
            "reward.components.selfverify.balance=pairs puts a pair's two answers in two groups of one step, but "
            f"trainer.prompts_per_step={groups}: raise it to 2 or more"
        )
    if joint_grpo and task_cfg.balance is SelfVerifyBalance.share and groups < 2:
        raise UserError(
            "reward.components.selfverify.schedule=joint mixes verification groups into batches of several "
            f"prompts, but trainer.prompts_per_step={groups}: raise it or use schedule=interleave"
        )
    if trainer_cfg.zero_variance_groups is ZeroVarianceGroups.resample:
        raise UserError(
            "trainer.zero_variance_groups=resample draws extra batches of fresh prompts, which the self-verification "
            "schedule does not count: use zero_variance_groups=skip or keep with reward=...selfverify"
        )
