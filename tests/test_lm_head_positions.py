"""grpo_exp.trainer.lm_head_positions: on CPU, the seam's loss forward scores only the positions with a label (the
completions'), as TRL's own fused LM head does on CUDA, and gives what TRL's forward over every position gives:
log-probabilities, entropies and gradients (tiny model, a real generated batch, the model's own logits as reference)."""

import pytest
import torch

from grpo_exp.trainer.lm_head_positions import labelled_positions_only
from grpo_exp.trainer.trl_contract import TRL_LM_HEAD_COMPACT
from tests.helpers.tiny_trainer import distinct, generation_batch, make_trainer


@pytest.fixture
def scored_positions(monkeypatch) -> list[int]:
    """How many positions each call of TRL's fused LM head scored (the rows it handed its chunked kernel)."""
    import trl.trainer.utils as trl_utils

    kernel, counts = trl_utils._ChunkedLogProbFunction, []

    class Counting:
        @staticmethod
        def apply(hidden, *args):
            counts.append(hidden.shape[0])
            return kernel.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Counting)
    return counts


@pytest.mark.parametrize("shared_prompt_forward", [True, False], ids=["packed", "trls rows"])
def test_the_loss_forward_scores_only_the_completions_and_gives_trls_values_and_gradients(
    tmp_path, scored_positions, shared_prompt_forward
):
    trainer = make_trainer(tmp_path, distinct, shared_prompt_forward=shared_prompt_forward)
    batch = generation_batch(trainer, prompts=3)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]

    def read(forward):
        trainer.model.zero_grad(set_to_none=True)
        logps, entropies = forward()
        (logps * batch["completion_mask"]).sum().backward()
        return logps.detach(), entropies.detach(), torch.cat([p.grad.flatten() for p in trainer.model.parameters()])

    def from_the_logits():  # every position's logits, as the model gives them: TRL's forward on CPU scores them all
        logits = trainer.model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1] / trainer.temperature
        log_probs = logits.log_softmax(-1)
        chosen = log_probs.gather(-1, batch["completion_ids"][..., None])[..., 0]
        return chosen, -(log_probs.exp() * log_probs).sum(-1)

    ours = read(lambda: trainer.per_token_logps(trainer.model, ids, mask, width, compute_entropy=True))
    (scored,) = scored_positions
    assert scored == mask[:, -width:].sum()  # each completion token, no prompt and no padding
    assert scored < ids.shape[0] * (ids.shape[1] - 1) // 2  # TRL's forward on CPU: every position
    for mine, logits in zip(ours, read(from_the_logits), strict=True):
        torch.testing.assert_close(mine, logits, rtol=1e-4, atol=1e-5)


def test_outside_the_seam_trl_decides_as_it_always_does():
    import importlib

    module, name = TRL_LM_HEAD_COMPACT
    cpu = torch.device("cpu")
    with labelled_positions_only():
        assert getattr(importlib.import_module(module), name)(cpu) is True
        with labelled_positions_only():  # nested: still on, and off only where the outer one ends
            pass
        assert getattr(importlib.import_module(module), name)(cpu) is True
    assert getattr(importlib.import_module(module), name)(cpu) is False  # a bare GRPOTrainer's forward, unchanged
