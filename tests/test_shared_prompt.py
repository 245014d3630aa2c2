"""trainer.shared_prompt_forward: the loss forward with each group's prompt read once gives TRL's per-token
log-probabilities, entropies and gradients (tiny model, a real generated batch, TRL's own forward as reference)."""

import pytest
import torch
from transformers import LlamaConfig

from grpo_exp.trainer.shared_prompt import IGNORE, pack_groups, packable, unpack
from tests.helpers.tiny_trainer import distinct, generation_batch, make_trainer


def test_a_group_is_packed_as_its_prompt_once_then_a_branch_per_completion():
    # rows: prompt [5 6 7] (left-padded) twice, and prompt [8 9]; completions right-padded to width 3
    input_ids = torch.tensor([[5, 6, 7, 20, 21, 0], [0, 8, 9, 30, 0, 0], [5, 6, 7, 40, 41, 42]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    packed = pack_groups(input_ids, attention, completion_width=3, pad_id=0)
    assert packed.input_ids.tolist() == [[5, 6, 7, 20, 21, 7, 40, 41, 42], [8, 9, 30, 0, 0, 0, 0, 0, 0]]
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert packed.shift_labels[0].tolist() == [IGNORE, IGNORE, 20, 21, IGNORE, 40, 41, 42, IGNORE]
    allowed = packed.allowed[0, 0]
    assert allowed[6].tolist() == [True, True, False, False, False, True, True, False, False]  # prompt + own branch
    assert allowed[8, 4].item() is False and allowed[4, 1].item() is True
    assert pack_groups(input_ids, attention, completion_width=3, pad_id=0, max_tokens=8) is None  # too long
    values = torch.arange(18.0).view(2, 9)
    assert unpack(values, packed, 3).tolist() == [[2.0, 3.0, 0.0], [10.0, 0.0, 0.0], [5.0, 6.0, 7.0]]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_shared_prompt_forward_gives_trls_log_probabilities_entropies_and_gradients(tmp_path, attention):
    trainer = make_trainer(tmp_path, distinct, attention=attention, shared_prompt_forward=True)
    batch = generation_batch(trainer, prompts=3)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    packed = pack_groups(ids, mask, width, trainer.processing_class.pad_token_id)
    assert packed.input_ids.shape[0] == 3 and packed.input_ids.numel() < 0.75 * ids.numel()  # fewer tokens

    def read(shared_prompt_forward: bool):
        trainer.args.shared_prompt_forward = shared_prompt_forward  # false: the seam hands the forward to TRL's
        trainer.model.zero_grad(set_to_none=True)
        logps, entropies = trainer.per_token_logps(trainer.model, ids, mask, width, compute_entropy=True)
        (logps * batch["completion_mask"]).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
        return logps.detach(), entropies.detach(), grads

    shared = read(True)
    trls = read(False)
    for ours, theirs in zip(shared, trls, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("attention", "window", "expected"),
    [("sdpa", None, True), ("eager", None, True), ("flash_attention_2", None, False), ("sdpa", 4096, False)],
)
def test_only_models_that_read_a_packed_group_as_trls_rows_are_packed(attention, window, expected):
    config = LlamaConfig(sliding_window=window)
    config._attn_implementation = attention
    assert packable(config) is expected


def test_a_model_that_cannot_be_packed_uses_trls_forward(tmp_path):
    trainer = make_trainer(tmp_path, distinct, shared_prompt_forward=True)
    trainer.model.config.sliding_window = 8
    calls = []

    def recording(module, args, kwargs):  # TRL's forward scores `labels`; the packed one, `shift_labels`
        if "labels" in kwargs:
            calls.append(kwargs["input_ids"].shape)

    trainer.model.register_forward_pre_hook(recording, with_kwargs=True)
    ids = torch.tensor([[1, 2, 3, 4]], device=trainer.model.device)
    trainer.per_token_logps(trainer.model, ids, torch.ones_like(ids), 2)
    assert calls == [(1, 4)]


def test_with_gradient_checkpointing_the_shared_prompt_forward_gives_trls_log_probabilities_and_gradients(tmp_path):
    """Gradient checkpointing (what users set at size, docs/scale.md) recomputes each layer in the backward: the packed
    forward's mask and positions reach the recomputation too."""
    checkpointing = ["+trainer.extra.gradient_checkpointing=true"]
    trainer = make_trainer(tmp_path, distinct, shared_prompt_forward=True, overrides=checkpointing)
    batch = generation_batch(trainer, prompts=3)
    assert trainer.args.gradient_checkpointing
    # as transformers' Trainer turns it on when training starts
    trainer.model.gradient_checkpointing_enable(trainer.args.gradient_checkpointing_kwargs)
    trainer.model.train()
    assert trainer.model.is_gradient_checkpointing
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]

    def read(shared_prompt_forward: bool):
        trainer.args.shared_prompt_forward = shared_prompt_forward
        trainer.model.zero_grad(set_to_none=True)
        logps, _ = trainer.per_token_logps(trainer.model, ids, mask, width)
        (logps * batch["completion_mask"]).sum().backward()
        return logps.detach(), torch.cat([p.grad.flatten() for p in trainer.model.parameters()])

    for ours, theirs in zip(read(True), read(False), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
