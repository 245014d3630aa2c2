"""eval.prepacked: held-out answers from the policy's prepacked float32 copy: greedy ones the same as generate()'s,
sampled ones the copy's own draws."""

import pytest
import torch

from grpo_exp.run import prepacked_eval
from grpo_exp.run.prepacked_eval import prepack_refusal, prepacked_completions
from grpo_exp.trainer.prepacked_linear import can_prepack
from support.config import resolved_config

needs_onednn = pytest.mark.skipif(
    not can_prepack(), reason="this torch build cannot prepack float32 weights (MKL or oneDNN)"
)


def questions(count: int) -> list:
    return [[{"role": "user", "content": f"What is {i} + {2 * i + 1}? Answer in a word."}] for i in range(count)]


@needs_onednn
def test_the_tiny_model_answers_the_same_from_its_prepacked_copy_and_follows_its_training(tiny_policy):
    from grpo_exp.generation import generate_completions

    model, tokenizer = tiny_policy
    prompts = questions(5)
    expected = generate_completions(model, tokenizer, prompts, 12, 2, None)
    answered = prepacked_completions(model, tokenizer, prompts, 12, 2, None)
    assert answered == expected, "batches of 2, one of them partial"
    # between evaluations the copy holds no weights: a run trains then, and it would add the policy's size to the peak
    copy = prepacked_eval._copies[model]
    assert all(p.numel() == 0 for p in copy.copy.parameters()) and all(
        packed.packed is None and packed.unpacked is None for packed in copy.prepacked.values()
    )
    with torch.no_grad():  # the weights move (a training step): the copy follows them
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    moved = generate_completions(model, tokenizer, prompts, 12, 2, None)
    assert moved != expected
    assert prepacked_completions(model, tokenizer, prompts, 12, 2, None) == moved


def test_the_copy_serves_only_float32_weights_on_cpu(tiny_policy):
    model, _ = tiny_policy
    assert prepack_refusal(model) in (None, "this torch build has no oneDNN (mkldnn) and no MKL")
    half = type(model)(model.config).to(torch.bfloat16)
    assert prepack_refusal(half) == "the policy's weights are not all float32"


@pytest.mark.slow
@needs_onednn
def test_the_embedded_model_answers_the_default_problems_the_same_from_its_prepacked_copy():
    """The default experiment's held-out evaluation, both ways, on its first 16 problems (one batch of the default
    eval.batch_size): identical completions, problem by problem. All 100: `python -m benchmarks.heldout_eval` (it
    counts the differing ones)."""
    from grpo_exp.data import load_splits
    from grpo_exp.models import load_model, load_tokenizer
    from grpo_exp.run.heldout import heldout_accuracy
    from grpo_exp.verification.labels import built_in_labels

    spec = resolved_config([])
    cfg = spec.cfg
    _, heldout = load_splits(cfg.dataset)
    assert len(heldout) == 100
    heldout = heldout.select(range(16))
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, cfg.trainer.seed, spec.policy_dtype)
    args = (model, tokenizer, heldout, built_in_labels(), spec.eval_max_new_tokens, cfg.eval.batch_size, None)
    today, prepacked = heldout_accuracy(*args, prepacked=False), heldout_accuracy(*args, prepacked=True)
    answers = zip(today.samples, prepacked.samples, strict=True)
    differing = [i for i, (a, b) in enumerate(answers) if a["completion"] != b["completion"]]
    assert differing == [], f"problems answered differently: {differing}"
    assert prepacked.accuracy == today.accuracy


@needs_onednn
def test_sampled_answers_are_the_copys_draws_again_alike_under_a_seed(tiny_policy, monkeypatch):
    """At a temperature (pass@k, the policy's own answers that self-verification judges) the copy draws the answers,
    not the policy's generate(): the same seed draws the same answers, another seed others."""
    model, tokenizer = tiny_policy
    prompts = questions(3) * 2

    def draw(seed: int) -> list[str]:
        torch.manual_seed(seed)
        return prepacked_completions(model, tokenizer, prompts, 12, 4, None, temperature=1.0)

    first = draw(0)  # the copy made
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: pytest.fail("the policy's generate() answered"))
    assert draw(0) == first and draw(1) != first
    assert len(set(first)) > 3  # sampled: a prompt's two answers differ
    assert prepacked_completions(model, tokenizer, prompts, 12, 4, None) != first  # greedy: not these draws
