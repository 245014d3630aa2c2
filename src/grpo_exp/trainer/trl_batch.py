"""TRL's generation batch (the dict `_generate_and_score_completions` returns), taken apart and put together:
rows selected, batches concatenated, and the factor that keeps TRL's loss normalisation when rows are left out.
Part of the seam (grpo_exp.trainer.seam): it knows TRL 1.16's keys and how each is padded, and
tests/test_trl_contract.py checks that knowledge against TRL.
"""

import copy
from collections.abc import Callable

import torch
from trl.models.utils import unwrap_model_for_generation

from grpo_exp.generation import prompt_ids
from grpo_exp.rollout.vllm_turns import turn_engine

# Per-row keys, [B, T_completion], right-padded: the value padding takes.
COMPLETION_PADDING = {
    "completion_ids": None,  # the tokenizer's pad token id
    "completion_mask": 0,
    "tool_mask": 1,
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 1.0,  # [B, 1] at sequence level: nothing to pad
}
# Per-row keys, [B, T_prompt], left-padded.
PROMPT_PADDING = {"prompt_ids": None, "prompt_mask": 0}
# Our key in TRL's generation batch: [B] bool, False for the rows of a group with no reward spread (skip/resample).
INFORMATIVE = "grpo_exp_informative"
PER_ROW = {"advantages", INFORMATIVE, *COMPLETION_PADDING, *PROMPT_PADDING}
# Scalars of the whole generation batch: its loss tokens over all processes (the dapo / cispo normaliser).
WHOLE_BATCH = {"num_items_in_batch"}

# Loss types whose normaliser counts the rows of the micro-batch ('grpo' and 'sapo' average per-sequence means,
# 'dr_grpo' divides by rows x max_completion_length, 'luspo' averages per-sequence sums), and the one that
# counts its tokens ('bnpo'). The others ('dapo', 'cispo', 'vespo') divide by num_items_in_batch, which spans
# the whole generation batch and does not change when rows are left out.
ROW_NORMALISED = {"grpo", "sapo", "dr_grpo", "luspo"}
TOKEN_NORMALISED = {"bnpo"}


def check_text_only(batch: dict) -> None:
    unknown = set(batch) - PER_ROW - WHOLE_BATCH
    if unknown:
        raise ValueError(f"zero_variance_groups=skip/resample handles text batches only, not {sorted(unknown)}")


def loss_mask(batch: dict) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if batch.get("tool_mask") is not None else mask


def mask_loss_tokens(batch: dict, mask: torch.Tensor | None, count_everywhere) -> None:
    """`mask` applied to TRL's completion mask, and TRL's token count (num_items_in_batch: the dapo / cispo
    normaliser) recounted; `count_everywhere(count)`: a count summed over every process (a collective). None: the
    batch as it is (None or not is the same on every process: TrainingHooks.loss_token_mask)."""
    if mask is None:
        return
    batch["completion_mask"] = batch["completion_mask"] * mask.to(batch["completion_mask"])
    batch["num_items_in_batch"] = count_everywhere(loss_mask(batch).sum())


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    """The batch's rows `rows` (indices), completion columns past the longest kept completion cut off (right
    padding only: no kept token's logits change). Whole-batch values stay as they are."""
    check_text_only(batch)
    kept = {key: value[rows] if key in PER_ROW and value is not None else value for key, value in batch.items()}
    width = int(kept["completion_mask"].sum(dim=1).max()) if len(rows) else 0
    for key in COMPLETION_PADDING:  # a [B, 1] sequence-level ratio stays as it is (width >= 1)
        if kept.get(key) is not None:
            kept[key] = kept[key][:, : max(width, 1)]
    if kept["advantages"].dim() == 2:  # per token (rollout.turn_credit=discounted_return)
        kept["advantages"] = kept["advantages"][:, : max(width, 1)]
    return kept


def loss_scale(loss_type: str, batch: dict, keep: torch.Tensor) -> float:
    """The factor that makes TRL's loss over the kept rows (`keep`: [B] bool) equal to its loss over all rows,
    given that the left-out rows contribute exactly zero (their advantages are zero and nothing else is added)."""
    if loss_type in ROW_NORMALISED:
        return keep.sum().item() / keep.numel()
    if loss_type in TOKEN_NORMALISED:
        mask = loss_mask(batch)
        return mask[keep].sum().item() / max(mask.sum().item(), 1.0)
    return 1.0


def concatenate(batches: list[dict], pad_token_id: int) -> dict:
    """Generation batches made one: prompts re-padded on the left, completions on the right, the whole-batch
    token count recomputed (one process: grpo_exp resamples in one process only)."""
    for batch in batches:
        check_text_only(batch)
    merged = {}
    for key in batches[0]:
        values = [batch[key] for batch in batches]
        if key in WHOLE_BATCH or values[0] is None:
            continue
        if key in PROMPT_PADDING:
            merged[key] = _cat_padded(values, _pad(PROMPT_PADDING[key], pad_token_id), left=True)
        elif key in COMPLETION_PADDING:  # a [B, 1] sequence-level ratio has width 1 everywhere: nothing padded
            merged[key] = _cat_padded(values, _pad(COMPLETION_PADDING[key], pad_token_id), left=False)
        elif key == "advantages" and values[0].dim() == 2:  # per token (rollout.turn_credit=discounted_return)
            merged[key] = _cat_padded(values, 0.0, left=False)
        else:
            merged[key] = torch.cat(values)
    merged["num_items_in_batch"] = loss_mask(merged).sum()
    return merged


def _pad(value, pad_token_id: int):
    return pad_token_id if value is None else value


def _cat_padded(values: list[torch.Tensor], pad, left: bool) -> torch.Tensor:
    width = max(v.shape[1] for v in values)
    padded = []
    for v in values:
        filler = v.new_full((v.shape[0], width - v.shape[1]), pad)
        padded.append(torch.cat([filler, v] if left else [v, filler], dim=1))
    return torch.cat(padded)


class RolloutFunc:
    """TRL's `rollout_func(prompts, trainer)` for a rollout object with `trl_batch(model, tokenizer, prompts,
    generation_kwargs, log_probs_at, rows) -> dict`, `run(...)` and `batch_of(trajectories, log_probs_at)`
    (grpo_exp.rollout.multiturn.MultiTurnRollout); `log_probs_at`: the temperature of the sampler's log-probabilities
    where the trainer's mismatch watch wants them, else None; `rows`: the prompts' dataset rows. With generation ahead
    (generation=vllm_async), the trajectories played ahead on the server (grpo_exp.trainer.async_generation)."""

    def __init__(self, rollout):
        self.rollout = rollout
        self.tokenizer = None  # the worker thread's own copy (a fast tokenizer is not to be shared across threads)

    def __call__(self, prompts: list, trainer) -> dict:
        log_probs_at = trainer.temperature if trainer.mismatch.wants_sampler_log_probs else None
        rows = trainer.rollout_rows  # the dataset rows of these prompts, in order (the seam keeps them)
        tokenizer = trainer.processing_class
        if trainer.ahead is not None:  # the server's log-probabilities: its staleness is corrected as its numerics
            played = trainer.ahead.trajectories(prompts, lambda: self.play_on_server(trainer, tokenizer, prompts, rows))
            return self.rollout.batch_of(played, trainer.temperature)
        if trainer.use_vllm:  # TRL synced the engine's weights before calling this
            return self.rollout.batch_of(self.play_on_server(trainer, tokenizer, prompts, rows), trainer.temperature)
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            sampler = trainer.sampler.model_for_turns(
                model, prompt_ids(tokenizer, prompts[0]), trainer.state.global_step
            )
            return self.rollout.trl_batch(sampler, tokenizer, prompts, trainer.generation_kwargs, log_probs_at, rows)

    def play_on_server(self, trainer, tokenizer, prompts: list, rows: list[dict] | None) -> list:
        """Every trajectory of `prompts` played on TRL's vLLM engine, each turn as its trajectory is ready, with the
        engine's log-probabilities (they cost nothing)."""
        sampling = {"temperature": trainer.temperature, "top_p": trainer.top_p}
        with turn_engine(trainer.vllm_generation, len(prompts)) as engine:
            return self.rollout.run(
                None, tokenizer, prompts, sampling, len(prompts), log_probs_at=trainer.temperature, rows=rows,
                engine=engine,
            )  # fmt: skip

    def play_ahead(self, trainer) -> Callable[[list, list[dict] | None], list]:
        """What generation ahead calls in its worker thread: a batch's rows played on the server, with a tokenizer
        of its own."""
        if self.tokenizer is None:
            self.tokenizer = copy.deepcopy(trainer.processing_class)
        return lambda prompts, rows: self.play_on_server(trainer, self.tokenizer, prompts, rows)
