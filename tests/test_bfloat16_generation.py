"""trainer.bfloat16_generation (generation=transformers_bf16): TRL's transformers generation samples from a bfloat16
copy of the policy, and the copy's log-probabilities are the behaviour policy that TRL's loss ratio is taken against.
TRL's GRPOTrainer really generates and computes its loss here (tiny model)."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from grpo_exp.errors import UserError
from grpo_exp.sampled_log_probs import SampledLogProbs
from grpo_exp.trainer.config import check_trainer
from grpo_exp.trainer.sampling_copy import SamplingCopy, through_first_eos
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import logged_steps, run_cli
from tests.helpers.tiny_trainer import G, generation_batch, make_trainer
from tests.test_zero_variance import gradient


def by_index(completions, **kwargs):
    return [float(i % G) for i in range(len(completions))]


def teacher_forced_log_probs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def sampling_config(tokenizer, **truncation) -> GenerationConfig:
    """TRL's sampling at temperature 0.7, 12 new tokens, with `truncation` (top_k, top_p)."""
    return GenerationConfig(
        do_sample=True,
        temperature=0.7,
        max_new_tokens=12,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id],
        **truncation,
    )


class ScriptedLogits(torch.nn.Module):
    """A model whose forward returns the next of `steps` ([B, V] logits each) at the last position, as generate()'s
    forwards do; the recorder sees it through its forward hook."""

    def __init__(self, *steps: torch.Tensor):
        super().__init__()
        self.steps = list(steps)

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.steps.pop(0)[:, None, :])


def recorded(steps: tuple[torch.Tensor, ...], tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """The recorder's log-probabilities of `tokens` ([B, T]) when step t's forward gave steps[t] and was fed the
    token sampled at step t - 1 (the prompt's last token first)."""
    model = ScriptedLogits(*steps)
    with SampledLogProbs(model, temperature) as record:
        model(input_ids=torch.zeros(tokens.shape[0], 3, dtype=torch.long))
        for t in range(1, tokens.shape[1]):
            model(input_ids=tokens[:, t - 1 : t])
    return record.of(tokens)


def test_sampled_log_probs_read_each_step_at_the_temperature_and_rows_end_at_their_first_eos():
    logits = (torch.tensor([[0.0, 0.0], [4.0, 0.0]]), torch.tensor([[0.0, float("-inf")], [2.0, 2.0]]))
    tokens = torch.tensor([[1, 0], [0, 1]])
    # temperature 2: log_softmax([0, 0]) = -0.6931; log_softmax([2, 0])[0] = -0.1269; [0, -inf] -> 0; [1, 1] -> -0.6931
    expected = torch.tensor([[-0.6931, 0.0], [-0.1269, -0.6931]])
    torch.testing.assert_close(recorded(logits, tokens, 2.0), expected, atol=1e-4, rtol=0)
    rows = torch.tensor([[5, 2, 9, 2], [5, 5, 5, 5], [3, 5, 5, 7]])
    assert through_first_eos(rows, [2, 7]) == [2, 4, 4]


def test_the_recorder_refuses_a_count_of_steps_that_is_not_the_count_of_tokens():
    model = ScriptedLogits(torch.zeros(1, 2), torch.zeros(1, 2))
    with SampledLogProbs(model, 1.0) as record:
        model(input_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="recorded 1 sampling steps for 2 generated tokens"):
        record.of(torch.zeros(1, 2, dtype=torch.long))


def test_top_p_sampled_tokens_carry_the_whole_distributions_log_probability_as_trls_loss_computes_it():
    """The top_p question, by hand. Logits [2, 1, 0, -1] at temperature 1: probabilities 0.6439, 0.2369, 0.0871,
    0.0321. top_p=0.7 keeps tokens 0 and 1 (0.6439 < 0.7 <= 0.8808) and renormalises: token 0 at 0.6439 / 0.8808 =
    0.7311 (log -0.3133). TRL's loss takes the new log-probability over the whole vocabulary: log 0.6439 = -0.4402.
    Handed the truncated one as the old, the ratio would be exp(-0.4402 + 0.3133) = 0.8808 (the kept mass) before any
    update: with a kept mass under 1 - epsilon = 0.8, PPO's clip would zero every negative advantage's gradient. So
    the sampler hands the whole distribution's: the ratio is 1 on-policy."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    token = torch.tensor([[0]])
    sampled = recorded((logits,), token, 1.0)
    trl_new = torch.log_softmax(logits, dim=-1)[0, 0]  # TRL: selective_log_softmax(logits / temperature)
    torch.testing.assert_close(sampled[0, 0], trl_new)
    assert float(sampled[0, 0]) == pytest.approx(-0.4402, abs=1e-4)
    kept = torch.softmax(logits, dim=-1)[0, :2]
    assert math.log(kept[0] / kept.sum()) == pytest.approx(-0.3133, abs=1e-4)  # the truncated one, not handed on


def test_with_top_p_the_copys_old_log_probabilities_are_trls_on_policy(tiny_policy):
    """The copy samples with top_k=5, top_p=0.5: what it hands on is its whole distribution at the temperature,
    teacher-forced (up to bfloat16 rounding between its cached and full forwards), never above it by the
    renormalisation (which, for the tiny model's flat distributions, would be ~log(V/5) higher)."""
    policy, tokenizer = tiny_policy
    sampler = SamplingCopy(policy)
    sampler.sync(policy, step=0)
    prompt = tokenizer("What is 2 + 3?")["input_ids"]
    torch.manual_seed(0)
    (completion,), (sampled,) = sampler.generate([prompt], sampling_config(tokenizer, top_k=5, top_p=0.5))
    whole = teacher_forced_log_probs(sampler.copy, prompt, completion, 0.7)
    torch.testing.assert_close(torch.tensor(sampled), whole, atol=0.03, rtol=0)


def test_the_sampler_gives_the_log_probabilities_of_the_copy_that_sampled(tiny_policy):
    policy, tokenizer = tiny_policy
    sampler = SamplingCopy(policy)
    sampler.sync(policy, step=0)
    assert {p.dtype for p in sampler.copy.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # the policy itself is untouched
    prompts = [tokenizer("What is 2 + 3?")["input_ids"], tokenizer("Add 10 and 4, then say why.")["input_ids"]]
    torch.manual_seed(0)
    completions, log_probs = sampler.generate(prompts, sampling_config(tokenizer, top_k=0))
    mismatch = []
    for prompt, completion, sampled in zip(prompts, completions, log_probs, strict=True):
        assert len(completion) == len(sampled) > 0
        of_copy = teacher_forced_log_probs(sampler.copy, prompt, completion, 0.7)
        of_policy = teacher_forced_log_probs(policy, prompt, completion, 0.7)
        # the copy's own distribution (up to bfloat16 rounding between cached and full forwards) ...
        torch.testing.assert_close(torch.tensor(sampled), of_copy, atol=0.03, rtol=0)
        mismatch.append((torch.tensor(sampled) - of_policy).abs())
    # ... which is not exactly the float32 policy's: hence the correction
    assert torch.cat(mismatch).max() > 1e-4


def test_the_copy_follows_the_policy_once_per_training_step(tiny_policy):
    policy, _ = tiny_policy
    sampler = SamplingCopy(policy)
    sampler.sync(policy, step=3)
    moved = [p.detach().clone() + 0.5 for p in policy.parameters()]
    changed = AutoModelForCausalLM.from_config(policy.config)
    with torch.no_grad():
        for target, value in zip(changed.parameters(), moved, strict=True):
            target.copy_(value)
    first = next(sampler.copy.parameters()).clone()
    sampler.sync(changed, step=3)  # the same step: no refresh (resampled batches of one step share the copy)
    assert torch.equal(next(sampler.copy.parameters()), first)
    sampler.sync(changed, step=4)
    for copied, value in zip(sampler.copy.parameters(), moved, strict=True):
        assert torch.equal(copied, value.to(torch.bfloat16))


def forward_calls(model: torch.nn.Module) -> list:
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


def test_in_the_trainer_the_copy_samples_not_the_policy(tmp_path):
    trainer = make_trainer(tmp_path, by_index, prompts=2, bfloat16_generation=True)
    generation_batch(trainer, prompts=2)  # makes the copy (TRL has patched the policy's forward: its fused LM head)
    copy = trainer.sampler.copy.copy
    # between generations its weights are freed (docs/scale.md), and made again in bfloat16 for the next batch
    assert all(p.numel() == 0 for p in copy.parameters())
    calls = []
    handle = copy.register_forward_hook(lambda module, args, output: calls.append(output.logits.shape))
    try:
        batch = generation_batch(trainer, prompts=2)
    finally:
        handle.remove()
    assert len(calls) >= batch["completion_ids"].shape[1]  # a forward of the copy for every sampled token
    sampled = batch["sampling_per_token_logps"][batch["completion_mask"].bool()]
    assert sampled.numel() and (sampled < 0).all()


def test_the_trainer_takes_its_loss_ratio_against_the_copy(tmp_path):
    trainer = make_trainer(tmp_path, by_index, prompts=2, bfloat16_generation=True)
    batch = generation_batch(trainer, prompts=2)
    sampled = batch["sampling_per_token_logps"]
    assert batch["old_per_token_logps"] is sampled
    mask = batch["completion_mask"].bool()
    assert mask.sum() > 0 and (sampled[mask] < 0).all()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        policy, _ = trainer.per_token_logps(trainer.model, ids, attention, mask.shape[1])
    gap = (policy - sampled)[mask].abs()
    assert 0 < gap.max() < 0.5  # near the float32 policy, not equal to it

    corrected, _ = gradient(trainer, batch)
    uncorrected, _ = gradient(trainer, {k: v for k, v in batch.items() if k != "old_per_token_logps"})
    assert torch.isfinite(corrected).all() and corrected.abs().max() > 0
    assert not torch.allclose(corrected, uncorrected, rtol=1e-6, atol=0)  # the ratio is not TRL's 1


def test_without_it_trl_generates_as_before(tmp_path):
    trainer = make_trainer(tmp_path, by_index, prompts=2)
    policy_calls = forward_calls(trainer.model)
    batch = generation_batch(trainer, prompts=2)
    assert len(policy_calls) > 0
    assert "sampling_per_token_logps" not in batch and "old_per_token_logps" not in batch
    assert trainer.sampler.copy is None


def test_a_policy_already_in_bfloat16_samples_itself(tmp_path):
    trainer = make_trainer(tmp_path, by_index, prompts=2, bfloat16_generation=True)
    trainer.model.to(torch.bfloat16)
    batch = generation_batch(trainer, prompts=2)
    assert trainer.sampler.copy is None and "old_per_token_logps" not in batch


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["generation=vllm_colocate", "trainer.fast_generation=true"], "use_vllm=true: vLLM samples instead"),
        (
            ["generation=transformers_bf16", "+trainer.extra.use_transformers_paged=true"],
            "use_transformers_paged=true: continuous batching samples instead",
        ),
    ],
)
def test_other_generation_paths_are_refused_with_it(overrides, message):
    cfg = compose_config(overrides)
    with pytest.raises(UserError, match=message):
        check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32)


def test_multi_turn_rollouts_are_refused_with_it():
    cfg = compose_config(["generation=transformers_bf16", "rollout=multiturn"])
    with pytest.raises(UserError, match="rollout=multiturn generates its turns itself"):
        check_trainer(cfg.trainer, 1, multiturn=True, policy_dtype=torch.float32)


@pytest.mark.parametrize(
    "launch",
    [
        "ACCELERATE_USE_DEEPSPEED",
        pytest.param(
            "ACCELERATE_USE_FSDP",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="without a GPU, FSDP itself is refused first (test_distributed)"
            ),
        ),
    ],
)
def test_a_float32_policy_sharded_by_accelerate_launch_is_refused_before_it_loads(monkeypatch, launch):
    monkeypatch.setenv(launch, "true")  # as `accelerate launch` sets it for a DeepSpeed / FSDP config
    cfg = compose_config(["generation=transformers_bf16"])
    with pytest.raises(UserError, match="copies a float32 policy whole: not under DeepSpeed or FSDP"):
        check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32)
    check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.bfloat16)  # it samples itself: no copy


@pytest.mark.e2e
def test_the_command_line_trains_with_generation_transformers_bf16(tmp_path):
    result = run_cli(
        *TINY_RUN,
        "logger=none",
        f"hydra.run.dir={tmp_path}",
        "generation=transformers_bf16",
        "trainer.zero_variance_groups=keep",
        "eval.before=false",
        "eval.after=false",
    )
    assert result.returncode == 0, result.stderr
    steps = logged_steps(tmp_path)
    trained = [s for s in steps if "loss" in s]
    assert trained and all("clip_ratio/region_mean" in s for s in trained)
