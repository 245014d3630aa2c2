"""One generation batch's sampler/trainer mismatch (trainer.mismatch_*): the trainer's own log-probabilities taken
where the batch's MismatchWatch (grpo_exp.trainer.mismatch_watch) needs them, then measured and corrected for. The
seam hands in the trainer's forward and a gather as plain callables: no TRL state is read here."""

from collections.abc import Callable

import torch

from grpo_exp.trainer.mismatch_watch import Gather, MismatchWatch


def completion_sequences(output: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """What the trainer's loss forward reads of TRL's generation batch: the ids and attention mask of prompt and
    completion together, and how many positions (the completion's) to keep."""
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    return ids, attention, output["completion_ids"].size(1)


def sampler_against_trainer(
    watch: MismatchWatch,
    output: dict,
    step: int,
    trainer_log_probs: Callable[[dict], torch.Tensor],
    gather: Gather,
    policy,
    temperature: float,
) -> dict[str, float]:
    """The metrics to record; the correction put into `output`. `trainer_log_probs` (one forward without gradient)
    runs only where TRL has not made that forward itself (old_per_token_logps) and the watch asks for it."""
    trainer_logps = None
    if watch.wants_trainer_log_probs(output, step):
        trainer_logps = output.get("old_per_token_logps")  # TRL's own forward, where it made one
        if trainer_logps is None:
            trainer_logps = trainer_log_probs(output)
    return watch.apply(output, trainer_logps, step, gather, policy, temperature)
