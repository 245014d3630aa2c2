"""One trainer's watch on the sampler/trainer mismatch (trainer.mismatch_*, float64_reference_*): which
log-probabilities it needs, the correction it puts into TRL's generation batch, the metrics it records
(grpo_exp.trainer.mismatch: the pure parts). The seam (grpo_exp.trainer.seam) hands it the batch, the trainer's own
log-probabilities and a gather.

Where TRL corrects itself (vLLM with vllm_importance_sampling_correction) it measures too, under the same names, and
this watch stands aside but for the float64 reference.
"""

from collections.abc import Callable

import torch

from grpo_exp.schema import MismatchCorrection
from grpo_exp.trainer.mismatch import (
    WEIGHTING,
    importance_weights,
    mismatch_metrics,
    mismatch_sums,
    reference_metrics,
    reference_sums,
    resolved_correction,
)
from grpo_exp.trainer.sampling_copy import SamplingCopy
from grpo_exp.trainer.trl_batch import loss_mask

Gather = Callable[[torch.Tensor], torch.Tensor]  # [n] of this process -> [processes, n] (a collective)


class MismatchWatch:
    def __init__(self, args, *, use_vllm: bool, trl_corrects: bool):
        """`args`: the GRPOExpConfig; `trl_corrects`: TRL measures and corrects itself (vLLM)."""
        self.stands_aside = trl_corrects
        self.paged = bool(args.use_transformers_paged)
        self.metrics_asked = args.mismatch_metrics
        # vLLM: an explicit correction became TRL's own vllm_importance_sampling_* (grpo_exp.trainer.config)
        self.correction_asked = None if use_vllm else args.mismatch_correction
        self.bfloat16_generation = args.bfloat16_generation and not use_vllm
        self.bfloat16_copy = self.bfloat16_generation  # until the policy's dtype is seen (see_policy)
        self.clip = (args.mismatch_clip_min, args.mismatch_clip_max)
        self.every, self.completions = args.float64_reference_every, args.float64_reference_completions
        self.exact: SamplingCopy | None = None  # the float64 copy, made at its first use

    def see_policy(self, dtype: torch.dtype) -> None:
        """The policy's dtype: a bfloat16 policy samples itself, with no copy to correct for."""
        self.bfloat16_copy = self.bfloat16_generation and dtype != torch.bfloat16

    @property
    def measure(self) -> bool:
        """auto: measured where a bfloat16 copy samples a policy of another dtype; the float32 paths sample the
        policy's own distribution, 1e-5 apart (experiments/README.md), for one more forward per step."""
        asked = self.metrics_asked if self.metrics_asked is not None else self.bfloat16_copy
        return bool(asked) and not self.paged and not self.stands_aside

    @property
    def correction(self) -> MismatchCorrection:
        return resolved_correction(self.correction_asked, self.bfloat16_copy)

    @property
    def wants_sampler_log_probs(self) -> bool:
        """Whether the sampler must return its log-probabilities (TRL's generate() and the float32 copy return none
        unless asked)."""
        corrects = not self.stands_aside and self.correction is not MismatchCorrection.none
        return self.measure or corrects or bool(self.every)

    def wants_trainer_log_probs(self, output: dict, step: int) -> bool:
        """Whether this batch needs the trainer's own log-probabilities (one forward without gradient, where TRL
        has not made it): to measure, to weight, or for the float64 reference."""
        if output.get("sampling_per_token_logps") is None:
            return False
        corrects = not self.stands_aside and self.correction in WEIGHTING
        return self.measure or corrects or self._reference_due(step)

    def _reference_due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def apply(
        self, output: dict, trainer_logps: torch.Tensor | None, step: int, gather: Gather, policy, temperature: float
    ) -> dict[str, float]:
        """The correction put into TRL's batch (`output`); the metrics to record. `trainer_logps`: None where
        wants_trainer_log_probs said no."""
        sampler = output.get("sampling_per_token_logps")
        if sampler is None:
            return {}
        mask = loss_mask(output)
        weights = None
        if self.stands_aside:
            pass
        elif self.correction in WEIGHTING:
            weights = importance_weights(trainer_logps, sampler, mask, self.correction, *self.clip)
            output["importance_sampling_ratio"] = weights  # TRL's key; the seam's loss applies it
        elif self.correction is MismatchCorrection.behaviour_ratio:
            output["old_per_token_logps"] = sampler
        metrics = {}
        if self.measure:
            metrics |= mismatch_metrics(gather(mismatch_sums(trainer_logps, sampler, mask, weights)))
        if self._reference_due(step):
            exact = self._float64_log_probs(output, policy, step, temperature)
            rows = slice(0, exact.shape[0])
            sums = reference_sums(trainer_logps[rows], sampler[rows], exact, mask[rows])
            metrics |= reference_metrics(gather(sums))
        return metrics

    @torch.no_grad()
    def _float64_log_probs(self, output: dict, policy, step: int, temperature: float) -> torch.Tensor:
        """The first `completions` rows' completion tokens scored by a float64 copy of the policy, fed what the
        trainer's forward is fed."""
        if self.exact is None:
            self.exact = SamplingCopy(policy, torch.float64)
        self.exact.sync(policy, step)
        rows = slice(0, self.completions)
        completion_ids = output["completion_ids"][rows]
        ids = torch.cat([output["prompt_ids"][rows], completion_ids], dim=1)
        attention = torch.cat([output["prompt_mask"][rows], output["completion_mask"][rows]], dim=1)
        logits = self.exact.copy(input_ids=ids, attention_mask=attention).logits
        logits = logits[:, -completion_ids.shape[1] - 1 : -1].double() / temperature
        return torch.log_softmax(logits, dim=-1).gather(2, completion_ids[..., None]).squeeze(2)
