"""The sampler's own log-probability of every token a generate() call samples, read while it runs.

As TRL's loss computes the policy's: log_softmax(logits / temperature) over the whole vocabulary, not the top-k /
top-p truncated distribution the token was drawn from (those would put every ratio at the kept mass before any
update: tests/test_bfloat16_generation.py). Recorded by a forward hook on the model, so that it works on any
generate() (TRL's own, the sampling copy's, the multi-turn rollout's) without asking generate() for its logits:
each forward's last-position distribution is read at the token the next forward is fed (the token sampled from
it), the last one at the final tokens. One [B, V] distribution is held at a time, not one per step.
"""

import torch


class SampledLogProbs:
    """with SampledLogProbs(model, temperature) as record: sequences = model.generate(...); then
    record.of(sequences[:, prompt_length:]) is each generated token's log-probability, [B, T]."""

    def __init__(self, model: torch.nn.Module, temperature: float):
        self.model, self.temperature = model, temperature
        self._columns: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None
        self._handle = None

    def __enter__(self) -> "SampledLogProbs":
        self._columns, self._pending = [], None
        self._handle = self.model.register_forward_hook(self._read, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    def _read(self, module, args, kwargs, output) -> None:
        fed = kwargs.get("input_ids", args[0] if args else None)
        if self._pending is not None:  # the token just sampled from the previous forward's distribution
            self._columns.append(self._pending.gather(1, fed[:, -1:].to(self._pending.device)).cpu())
        logits = output.logits if hasattr(output, "logits") else output[0]
        self._pending = torch.log_softmax(logits[:, -1, :].float() / self.temperature, dim=-1)

    def of(self, generated: torch.Tensor) -> torch.Tensor:
        """[B, T] log-probabilities of `generated` ([B, T]: the tokens generate() appended, padding included)."""
        steps = len(self._columns) + (self._pending is not None)
        if steps != generated.shape[1]:
            raise RuntimeError(f"recorded {steps} sampling steps for {generated.shape[1]} generated tokens")
        if not steps:
            return torch.zeros(generated.shape)
        last = self._pending.gather(1, generated[:, -1:].to(self._pending.device)).cpu()
        return torch.cat([*self._columns, last], dim=1)

    def of_lists(self, completions: list[list[int]], pad: int = 0) -> list[list[float]]:
        """Each completion's log-probabilities, for completions cut after their end (as TRL cuts them): the longest
        ran every step, and a shorter one's tokens are the first of its row."""
        steps = len(self._columns) + (self._pending is not None)
        padded = torch.tensor([ids + [pad] * (steps - len(ids)) for ids in completions]).view(len(completions), -1)
        log_probs = self.of(padded)
        return [row[: len(ids)].tolist() for row, ids in zip(log_probs, completions, strict=True)]
