"""GRPOExpTrainer: TRL's GRPOTrainer plus group statistics. TRL's loss and sampling are untouched.

After each generation batch is scored, the batch TRL has just recorded (prompts, completions, per-component
rewards, advantages) is reshaped to [prompts, G] and summarised by grpo_exp.stats; the scalars join TRL's own
metrics (averaged and logged at each logging step, so they reach W&B and metrics.jsonl alike). Histograms of
the per-group reward mean and std go to W&B, and every `stats.table_every` steps a few whole groups go to a
W&B table and to samples.jsonl in the run directory.
"""

import json
import math
import time
from pathlib import Path

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from grpo_exp.rewards.text import completion_text
from grpo_exp.stats import group_statistics
from grpo_exp.verification import Verifier


class GRPOExpTrainer(GRPOTrainer):
    def __init__(self, *args, verifier: Verifier, stats_cfg, samples_path: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.verifier = verifier
        self.stats_cfg = stats_cfg
        self.samples_path = samples_path

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.stats_cfg.enabled and self.model.training:
            started = time.perf_counter()
            self._record_group_statistics(inputs, output)
            # Our own cost, logged beside TRL's step_time so that the overhead is always visible.
            self._metrics["train"]["timing/group_stats_s"].append(time.perf_counter() - started)
        return output

    def _record_group_statistics(self, inputs, output) -> None:
        group_size = self.num_generations
        # TRL keeps exactly the last generation batch (gathered over processes) in these deques.
        prompts = list(self._logs["prompt"])
        texts = [completion_text(c) for c in self._logs["completion"]]
        names = list(self.reward_func_names)
        per_component = torch.tensor([list(self._logs["rewards"][n]) for n in names], dtype=torch.float32).T
        advantages = torch.tensor(list(self._logs["advantages"]), dtype=torch.float32)
        lengths = self.accelerator.gather(output["completion_mask"].sum(dim=1)).float().cpu()
        solutions = gather_object([x.get("solution") for x in inputs])
        correct = self._correctness(texts, solutions)

        shape = (-1, group_size)
        weights = self.reward_weights.cpu()
        total = (per_component * weights).nansum(dim=1)
        total[torch.isnan(per_component).all(dim=1)] = math.nan
        grouped_texts = [texts[i : i + group_size] for i in range(0, len(texts), group_size)]
        stats = group_statistics(
            per_component.view(-1, group_size, len(names)),
            names,
            total.view(shape),
            advantages.view(shape),
            correct.view(shape),
            grouped_texts,
            lengths.view(shape),
        )
        for key, value in stats.items():
            self._metrics["train"][key].append(value)
        if self.accelerator.is_main_process:
            step = self.state.global_step + 1  # the optimisation step this batch feeds
            self._log_groups(step, prompts, texts, names, per_component, total, advantages, correct, group_size)

    def _correctness(self, texts: list[str], solutions: list) -> torch.Tensor:
        """1/0 per completion from the verifier; NaN where no reference exists or it cannot be parsed."""
        if any(s is None for s in solutions):
            return torch.full((len(texts),), math.nan)
        labels = self.verifier(texts, [str(s) for s in solutions])
        return torch.tensor([math.nan if label is None else float(label) for label in labels])

    def _log_groups(self, step, prompts, texts, names, per_component, total, advantages, correct, group_size):
        import wandb

        grouped_total = total.view(-1, group_size)
        if wandb.run is not None:
            wandb.log({
                "groups/reward_mean_hist": wandb.Histogram(torch.nanmean(grouped_total, dim=1).nan_to_num().numpy()),
                "groups/reward_std_hist": wandb.Histogram(_nanstd(grouped_total).nan_to_num().numpy()),
                "train/global_step": step,
            })  # fmt: skip
        if (step - 1) % self.stats_cfg.table_every:
            return
        rows = []
        for group in range(min(self.stats_cfg.table_groups, len(texts) // group_size)):
            for i in range(group * group_size, (group + 1) * group_size):
                rows.append({
                    "step": step,
                    "group": group,
                    "prompt": completion_text(prompts[i]),
                    "completion": texts[i],
                    **{f"reward/{n}": _float(per_component[i, j]) for j, n in enumerate(names)},
                    "reward": _float(total[i]),
                    "advantage": _float(advantages[i]),
                    "correct": _float(correct[i]),
                })  # fmt: skip
        with self.samples_path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        if wandb.run is not None and rows:
            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
            wandb.log({"groups/samples": table, "train/global_step": step})


def _nanstd(grouped: torch.Tensor) -> torch.Tensor:
    centred = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    return torch.sqrt(torch.nanmean(centred**2, dim=1))


def _float(value: torch.Tensor) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value
