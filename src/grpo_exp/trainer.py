"""GRPOExpTrainer: TRL's GRPOTrainer plus group statistics and the self-verification task.

TRL's sampling and loss are untouched; two hooks around `_generate_and_score_completions`:
- before it, when `selfverify` is in the reward mix, some groups of the batch are replaced by verification
  prompts built from recent on-policy samples (grpo_exp.selfverify), per the schedule;
- after it, the batch TRL has just recorded (prompts, completions, per-component rewards, advantages) is
  reshaped to [prompts, G] and summarised by grpo_exp.stats; the scalars join TRL's own metrics (averaged and
  logged each logging step, reaching W&B and metrics.jsonl alike). Histograms of the per-group reward go to
  W&B, and every `stats.table_every` steps a few whole groups go to a W&B table and samples.jsonl. Labelled
  generation samples feed the self-verification buffer.
"""

import json
import math
import time
from collections import deque
from pathlib import Path

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from grpo_exp.flow import broadcast_to_turns, trajectory_statistics
from grpo_exp.rewards.text import completion_text
from grpo_exp.rollout import TRAJECTORY_FIELDS
from grpo_exp.selfverify import (
    YES,
    Candidate,
    candidates_from_groups,
    filter_candidates,
    judgement_metrics,
    parse_judgement,
    probability_metrics,
    select_samples,
    shown_answer,
    verification_prompt,
)
from grpo_exp.stats import group_statistics, group_std
from grpo_exp.verification import Verifier

ROW_KEYS = ("question", "solution", "task", "verify_label", "pass_rate", *TRAJECTORY_FIELDS)


class GRPOExpTrainer(GRPOTrainer):
    def __init__(self, *args, verifier: Verifier, stats_cfg, samples_path: Path, selfverify_cfg=None, p_yes=None,
                 **kwargs):  # fmt: skip
        super().__init__(*args, **kwargs)
        self.verifier = verifier
        self.stats_cfg = stats_cfg
        self.samples_path = samples_path
        self.selfverify_cfg = selfverify_cfg
        self.p_yes = p_yes  # P(Yes) scorer for the self-verification metrics (AUROC, calibration)
        self.candidates: deque[Candidate] = deque(maxlen=selfverify_cfg.buffer_size if selfverify_cfg else 1)
        self._problems_seen = 0

    def _metric(self, key: str, value: float) -> None:
        self._metrics["train"][key].append(value)

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        if self.selfverify_cfg is not None and training:
            inputs = self._mix_in_verification(inputs)
        output = super()._generate_and_score_completions(inputs)
        if training and (self.stats_cfg.enabled or self.selfverify_cfg is not None):
            started = time.perf_counter()
            batch = self._scored_batch(inputs, output)
            if self.stats_cfg.enabled:
                self._record_group_statistics(batch)
            if self.selfverify_cfg is not None:
                self._record_judgements(batch)
                self.candidates.extend(self._candidates(batch))
            # Our own cost, logged beside TRL's step_time so that the overhead is always visible.
            self._metric("timing/group_stats_s", time.perf_counter() - started)
        return output

    # ---- the batch as [prompts, G] -------------------------------------------------------------------------

    def _scored_batch(self, inputs, output) -> dict:
        # TRL keeps exactly the last generation batch (gathered over processes) in these deques.
        names = list(self.reward_func_names)
        rows = gather_object([{key: row.get(key) for key in ROW_KEYS} for row in inputs])
        trajectories = [completion_text(c) for c in self._logs["completion"]]
        multiturn = rows[0]["num_turns"] is not None
        policy_tokens = output["completion_mask"] * output.get("tool_mask", 1)
        # A multi-turn trajectory is judged by its final turn (the tools' output is not the policy's answer).
        texts = [row["final_turn"] for row in rows] if multiturn else trajectories
        per_component = torch.tensor([list(self._logs["rewards"][n]) for n in names], dtype=torch.float32).T
        total = (per_component * self.reward_weights.cpu()).nansum(dim=1)
        total[torch.isnan(per_component).all(dim=1)] = math.nan
        labels = self.verifier(texts, [None if r["solution"] is None else str(r["solution"]) for r in rows])
        return {
            "names": names,
            "rows": rows,
            "prompts": list(self._logs["prompt"]),
            "texts": texts,
            "trajectories": trajectories if multiturn else None,
            "per_component": per_component,
            "total": total,
            "advantages": torch.tensor(list(self._logs["advantages"]), dtype=torch.float32),
            # The policy's own tokens: a multi-turn trajectory's observations are not its length.
            "lengths": self.accelerator.gather(policy_tokens.sum(dim=1)).float().cpu(),
            "correct": torch.tensor([math.nan if label is None else float(label) for label in labels]),
        }

    def _record_group_statistics(self, batch: dict) -> None:
        size = self.num_generations
        texts = batch["texts"]
        stats = group_statistics(
            batch["per_component"].view(-1, size, len(batch["names"])),
            batch["names"],
            batch["total"].view(-1, size),
            batch["advantages"].view(-1, size),
            batch["correct"].view(-1, size),
            [texts[i : i + size] for i in range(0, len(texts), size)],
            batch["lengths"].view(-1, size),
        )
        if batch["trajectories"] is not None:
            stats |= trajectory_statistics(batch["rows"], batch["total"].tolist())
        for key, value in stats.items():
            self._metric(key, value)
        if self.accelerator.is_main_process:
            self._log_groups(self.state.global_step + 1, batch)  # the optimisation step this batch feeds

    # ---- self-verification ---------------------------------------------------------------------------------

    def _mix_in_verification(self, inputs: list[dict]) -> list[dict]:
        """Replace the last groups of the batch with verification prompts, as the schedule says."""
        cfg, size = self.selfverify_cfg, self.num_generations
        rows = [{**row, "task": "generate", "verify_label": None, "pass_rate": None} for row in inputs]
        groups = len(rows) // size
        if cfg.schedule == "joint":
            wanted = max(1, round(cfg.fraction * groups))
        elif cfg.schedule == "interleave":
            wanted = groups if (self.state.global_step + 1) % cfg.every == 0 else 0
        else:  # verify_only: answers are sampled from the current policy first, then judged
            wanted = groups
            self.candidates.extend(self._sample_candidates(rows))
        if not wanted:
            return rows
        kept, removed = filter_candidates(list(self.candidates), cfg.drop_no_answer, cfg.drop_all_wrong)
        chosen = select_samples(
            kept, wanted, cfg.yes_share, cfg.per_problem, seed=self.args.seed + self.state.global_step
        )
        self._metric("selfverify/candidates", float(len(self.candidates)))
        self._metric("selfverify/removed_no_answer", float(removed["no_answer"]))
        self._metric("selfverify/removed_all_wrong", float(removed["all_wrong"]))
        self._metric("selfverify/groups", float(len(chosen)))
        if not chosen:
            return rows
        self._metric("selfverify/yes_share", sum(c.correct for c in chosen) / len(chosen))
        self._record_p_yes(chosen)
        for offset, candidate in enumerate(chosen):
            group = groups - len(chosen) + offset
            row = {
                "prompt": verification_prompt(candidate, cfg.template, cfg.show),
                "question": candidate.question,
                "solution": None,
                "task": "verify",
                "verify_label": candidate.label,
                "pass_rate": candidate.pass_rate,
            }
            rows[group * size : (group + 1) * size] = [dict(row) for _ in range(size)]
        return rows

    def _record_p_yes(self, chosen: list[Candidate]) -> None:
        """AUROC / Brier / ECE of the verifier's P(Yes) on the selected answers (one forward pass)."""
        if self.p_yes is None:
            return
        shown = [shown_answer(c, self.selfverify_cfg.show) for c in chosen]
        scores = self.p_yes([c.question for c in chosen], shown)
        for key, value in probability_metrics(scores, [c.correct for c in chosen], "selfverify/p_yes").items():
            self._metric(key, value)

    def _record_judgements(self, batch: dict) -> None:
        verify = [i for i, row in enumerate(batch["rows"]) if row["task"] == "verify"]
        if not verify:
            return
        predicted = [parse_judgement(batch["texts"][i], self.selfverify_cfg.strict_verdict) for i in verify]
        stats = judgement_metrics(
            [None if p is None else p == YES for p in predicted],
            [batch["rows"][i]["verify_label"] == YES for i in verify],
            "selfverify",
        )
        for key, value in stats.items():
            self._metric(key, value)

    def _candidates(self, batch: dict) -> list[Candidate]:
        """Labelled generation samples of this batch, one problem per group (verification groups left out)."""
        size = self.num_generations
        starts = [s for s in range(0, len(batch["texts"]), size) if batch["rows"][s]["task"] != "verify"]
        texts = [t for s in starts for t in batch["texts"][s : s + size]]
        labels = [None if math.isnan(v) else v == 1.0 for s in starts for v in batch["correct"][s : s + size].tolist()]
        found = candidates_from_groups([batch["rows"][s]["question"] for s in starts], texts, labels, size,
                                       first_problem=self._problems_seen)  # fmt: skip
        self._problems_seen += len(starts)
        return found

    def _sample_candidates(self, rows: list[dict]) -> list[Candidate]:
        """verify_only: answers to this batch's problems, sampled from the current policy (not trained on)."""
        from grpo_exp.evaluate import generate_completions

        size = self.num_generations
        problems = rows[::size]
        prompts = [row["prompt"] for row in problems for _ in range(size)]
        texts = generate_completions(
            self.model, self.processing_class, prompts, self.max_completion_length, len(prompts), None,
            self.temperature,
        )  # fmt: skip
        labels = self.verifier(texts, [str(row["solution"]) for row in problems for _ in range(size)])
        batch = {
            "rows": [row for row in problems for _ in range(size)],
            "texts": texts,
            "correct": torch.tensor([math.nan if label is None else float(label) for label in labels]),
        }
        return self._candidates(batch)

    # ---- sampled groups: W&B histograms and tables, samples.jsonl ------------------------------------------

    def _log_groups(self, step: int, batch: dict) -> None:
        import wandb

        size, texts, total = self.num_generations, batch["texts"], batch["total"]
        grouped_total = total.view(-1, size)
        if wandb.run is not None:
            wandb.log({
                "groups/reward_mean_hist": wandb.Histogram(_histogram_values(torch.nanmean(grouped_total, dim=1))),
                "groups/reward_std_hist": wandb.Histogram(_histogram_values(group_std(grouped_total))),
                "train/global_step": step,
            })  # fmt: skip
        if (step - 1) % self.stats_cfg.table_every:
            return
        rows = []
        trajectory_columns = self._trajectory_columns(batch)
        for group in range(min(self.stats_cfg.table_groups, len(texts) // size)):
            for i in range(group * size, (group + 1) * size):
                rows.append({
                    "step": step,
                    "group": group,
                    "task": batch["rows"][i]["task"] or "generate",
                    "prompt": completion_text(batch["prompts"][i]),
                    "completion": texts[i],
                    **{f"reward/{n}": _float(batch["per_component"][i, j]) for j, n in enumerate(batch["names"])},
                    "reward": _float(total[i]),
                    "advantage": _float(batch["advantages"][i]),
                    "correct": _float(batch["correct"][i]),
                    **trajectory_columns[i],
                })  # fmt: skip
        with self.samples_path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        if wandb.run is not None and rows:
            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[_cell(row[c]) for c in columns] for row in rows])
            wandb.log({"groups/samples": table, "train/global_step": step})

    @staticmethod
    def _trajectory_columns(batch: dict) -> list[dict]:
        """Multi-turn: each whole trajectory, its turns, and the advantage each of its turns was trained with."""
        if batch["trajectories"] is None:
            return [{}] * len(batch["texts"])
        rows = batch["rows"]
        per_turn = broadcast_to_turns([_float(a) for a in batch["advantages"]], [r["num_turns"] for r in rows])
        return [
            {"trajectory": trajectory, "turns": row["num_turns"], "tool_calls": row["tool_calls"],
             "tool_errors": row["tool_errors"], "turn_advantages": advantages}
            for trajectory, row, advantages in zip(batch["trajectories"], rows, per_turn, strict=True)
        ]  # fmt: skip


def _histogram_values(values: torch.Tensor):
    """Rounded: values a few ulps apart (float noise) make numpy refuse 64 bins over that range."""
    return torch.round(values.nan_to_num(), decimals=6).numpy()


def _cell(value):
    return json.dumps(value) if isinstance(value, list) else value


def _float(value: torch.Tensor) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value
