"""rollout.cache_turns: the batch kept in generate()'s layout between turns (grpo_exp.rollout.turn_cache) reads every
trajectory as its context prefilled whole does: the same next-token distribution, the same greedy turns. On the tiny
random model, with a shared prefix, repeated prompts, turns cut short, observations of different lengths (one empty)
and trajectories that end early. The multi-turn loop on both paths: tests/test_rollout.py."""

import copy

import pytest
import torch

from grpo_exp.generation import cache_argument
from grpo_exp.rollout.turn_cache import after_turn, common_prefix_length, first_turn, next_turn, turns_cacheable

GREEDY = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}


def test_the_common_prefix_leaves_every_context_a_token_of_its_own():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical: the last token is still each row's
    assert common_prefix_length([[1, 2], [3, 4]]) == 0
    assert common_prefix_length([[7]]) == 0


def test_a_model_whose_attention_takes_no_holes_is_played_whole(tiny_policy):
    model, _ = tiny_policy
    assert turns_cacheable(model.config) is None
    config = model.config.__class__.from_dict(model.config.to_dict())
    config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in turns_cacheable(config)


def whole_next_logits(model, contexts: list[list[int]]) -> torch.Tensor:
    """Each context's next-token logits, prefilled alone."""
    return torch.stack([model(input_ids=torch.tensor([c])).logits[0, -1] for c in contexts])


def cached_next_logits(model, batch) -> torch.Tensor:
    """The next-token logits generate() samples from for the cached batch: its uncached columns fed on its cache."""
    cache = batch.cache
    fed = cache.get_seq_length()
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    copied = copy.deepcopy(cache)  # the batch can still be generated from
    out = model(
        input_ids=batch.input_ids[:, fed:],
        attention_mask=batch.attention_mask,
        position_ids=positions[:, fed:],
        **{cache_argument(model): copied},
        use_cache=True,
    )
    return out.logits[:, -1]


@torch.no_grad()
def test_turns_read_on_the_kept_cache_as_their_whole_context_prefilled(tiny_policy):
    model, tokenizer = tiny_policy
    pad = tokenizer.pad_token_id
    system = tokenizer("A shared system message and a demonstration.", add_special_tokens=False)["input_ids"]
    prompts = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in ("What is 2 + 2?", "Name a colour.")]
    contexts = [system + prompts[0]] * 2 + [system + prompts[1]] * 2  # two prompts, two trajectories each
    batch = first_turn(model, contexts, pad)
    assert batch.cache.get_seq_length() == batch.length - 1
    torch.testing.assert_close(cached_next_logits(model, batch), whole_next_logits(model, contexts))

    for kept, observations in [
        ([6, 3, 1, 6], [[11, 12, 13], [], [21], [31, 32, 33, 34, 35]]),  # cut short; one observation empty
        ([2, 6, 4, 5], [[41], [42, 43], [44, 45, 46], [47]]),
    ]:
        output = model.generate(**batch.generate_inputs(model), **GREEDY, max_new_tokens=6, pad_token_id=pad)
        generated = output[:, batch.length :].tolist()
        # the same greedy turn as from the whole context
        for context, row in zip(contexts, generated, strict=True):
            alone = model.generate(torch.tensor([context]), **GREEDY, max_new_tokens=6, pad_token_id=pad)
            assert alone[0, len(context) :].tolist() == row
        contexts = [c + row[:n] + o for c, row, n, o in zip(contexts, generated, kept, observations, strict=True)]
        batch = next_turn(after_turn(batch, output, kept), [0, 1, 2, 3], observations, pad)
        torch.testing.assert_close(
            cached_next_logits(model, batch), whole_next_logits(model, contexts), atol=2e-5, rtol=0
        )

    going = [1, 3]  # the others ended
    output = model.generate(**batch.generate_inputs(model), **GREEDY, max_new_tokens=4, pad_token_id=pad)
    generated = output[:, batch.length :].tolist()
    batch = next_turn(after_turn(batch, output, [4] * 4), going, [[51, 52], [53]], pad)
    contexts = [contexts[i] + generated[i] + o for i, o in zip(going, [[51, 52], [53]], strict=True)]
    assert batch.input_ids.shape[0] == 2 and batch.cache.get_seq_length() == batch.length - 3  # [51, 52] padded
    assert all(layer.keys.shape[0] == 2 for layer in batch.cache.layers), "the ended trajectories' cache is freed"
    torch.testing.assert_close(cached_next_logits(model, batch), whole_next_logits(model, contexts), atol=2e-5, rtol=0)


@pytest.mark.parametrize("uniform", [False, True])  # True: one forward whatever the contexts (sharded processes)
@pytest.mark.parametrize("contexts", [[[5, 6, 7]], [[5, 6, 7], [8, 9]], [[5, 6], [5, 6]], [[1, 2, 3, 4], [1, 2, 5]]])
@torch.no_grad()
def test_the_first_turn_needs_no_shared_prefix_nor_repeats(tiny_policy, contexts, uniform):
    model, tokenizer = tiny_policy
    batch = first_turn(model, contexts, tokenizer.pad_token_id, uniform=uniform)
    torch.testing.assert_close(cached_next_logits(model, batch), whole_next_logits(model, contexts))
