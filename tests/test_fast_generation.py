"""trainer.fast_generation (generation=transformers_fast): on CPU, TRL's transformers generation samples from a copy
of the policy in its own dtype, its Linear weights prepacked for oneDNN and each prompt's prefill computed once for
its G completions. In float32 that must be the policy's own distribution: with the same seed, the same tokens.
TRL's GRPOTrainer really generates here (tiny model)."""

import math
import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from grpo_exp.errors import UserError
from grpo_exp.trainer import sampling
from grpo_exp.trainer.config import check_trainer
from grpo_exp.trainer.prepacked_linear import ONEDNN_BF16_ENV, PrepackedLinear, mkl_packs, prepack_unsupported
from grpo_exp.trainer.sampling_copy import SamplingCopy, shared_prefill
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import logged_steps, run_cli
from tests.helpers.tiny_trainer import generation_batch, logged, make_trainer

BF16_PREPACK_UNSUPPORTED = prepack_unsupported(torch.bfloat16)  # e.g. an AVX2-only CPU, or GRPO_EXP_ONEDNN_BF16=0
NO_AVX512 = "this CPU cannot prepack bfloat16 weights for oneDNN (needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)"


def by_index(completions, **kwargs):
    return [float(i % 4) for i in range(len(completions))]


def chat(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def group_prompts(tokenizer) -> list[list[int]]:
    """Three prompts of different lengths, two of them repeated as TRL repeats a group's prompt, one alone."""
    questions = ["What is 2 + 3?", "Add 10 and 4, then say why the sum is what it is.", "Name a prime."]
    return [chat(tokenizer, q) for q, repeats in zip(questions, (3, 3, 1), strict=True) for _ in range(repeats)]


def policy_generate(policy, prompts: list[list[int]], config: GenerationConfig) -> list[list[int]]:
    """The policy's own generate() on the left-padded batch, as TRL calls it, cut after the first EOS."""
    width = max(map(len, prompts))
    ids = torch.tensor([[config.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = policy.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
    eos = config.eos_token_id[0]
    return [row[: row.index(eos) + 1] if eos in row else row for row in out]


def sampling_config(tokenizer, do_sample: bool) -> GenerationConfig:
    return GenerationConfig(
        do_sample=do_sample,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=16,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id],
    )


def test_the_prepacked_copy_computes_the_policys_logits(tiny_policy):
    policy, tokenizer = tiny_policy
    fast = SamplingCopy(policy, torch.float32, prepack=True)
    linears = [m for m in policy.modules() if type(m) is torch.nn.Linear]
    assert len(fast.prepacked) == len(linears) > 0
    assert not any(type(m) is torch.nn.Linear for m in fast.copy.modules())
    ids = torch.tensor([chat(tokenizer, "What is 2 + 3?")])
    with torch.no_grad():
        torch.testing.assert_close(fast.copy(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-4, rtol=0)


def test_the_prepacked_copy_follows_the_policy_once_per_training_step(tiny_policy):
    policy, tokenizer = tiny_policy
    fast = SamplingCopy(policy, torch.float32, prepack=True)
    fast.sync(policy, step=1)
    changed = AutoModelForCausalLM.from_config(policy.config).eval()
    with torch.no_grad():
        for target, source in zip(changed.parameters(), policy.parameters(), strict=True):
            target.copy_(source * 1.5)
    ids = torch.tensor([chat(tokenizer, "What is 2 + 3?")])
    with torch.no_grad():
        before = fast.copy(input_ids=ids).logits
        fast.sync(changed, step=1)  # the same step: not refreshed
        assert torch.equal(fast.copy(input_ids=ids).logits, before)
        fast.sync(changed, step=2)  # every weight, prepacked ones included
        torch.testing.assert_close(fast.copy(input_ids=ids).logits, changed(input_ids=ids).logits, atol=1e-4, rtol=0)


def test_the_shared_prefill_is_each_distinct_prompts_cache_repeated(tiny_policy):
    policy, tokenizer = tiny_policy
    prompts = group_prompts(tokenizer)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        cache = shared_prefill(policy, ids, mask)
        assert cache.get_seq_length() == width - 1 and cache.layers[0].keys.shape[0] == len(prompts)
        assert torch.equal(cache.layers[0].keys[0], cache.layers[0].keys[2])  # one computation, repeated
        for row, prompt in enumerate(prompts):  # each row's keys and values: its prompt's own, alone and unpadded
            alone = policy(input_ids=torch.tensor([prompt[:-1]]), use_cache=True).past_key_values
            for shared, own in zip(cache.layers, alone.layers, strict=True):
                real = slice(width - len(prompt), width - 1)
                torch.testing.assert_close(shared.keys[row, :, real], own.keys[0], atol=1e-5, rtol=0)
                torch.testing.assert_close(shared.values[row, :, real], own.values[0], atol=1e-5, rtol=0)
        assert shared_prefill(policy, ids[[0, 3, 6]], mask[[0, 3, 6]]) is None  # nothing repeats: nothing shared


@pytest.mark.parametrize("do_sample", [False, True])
def test_the_fast_copy_samples_what_the_policy_samples(tiny_policy, do_sample):
    """The same seed gives the same tokens: the copy's distribution is the policy's (greedy, and sampled at
    temperature 1 over the whole vocabulary), the shared prefill included."""
    policy, tokenizer = tiny_policy
    prompts, config = group_prompts(tokenizer), sampling_config(tokenizer, do_sample)
    fast = SamplingCopy(policy, torch.float32, prepack=True)
    torch.manual_seed(7)
    completions, log_probs = fast.generate(prompts, config, with_log_probs=False)
    torch.manual_seed(7)
    assert completions == policy_generate(policy, prompts, config)
    assert log_probs is None and sum(map(len, completions)) > len(prompts)


def test_in_the_trainer_the_fast_copy_samples_as_trl_does(tmp_path):
    plain = make_trainer(tmp_path, by_index, prompts=2)
    fast = make_trainer(tmp_path, by_index, prompts=2, fast_generation=True)
    torch.manual_seed(3)
    expected = generation_batch(plain, prompts=2)
    torch.manual_seed(3)
    batch = generation_batch(fast, prompts=2)
    assert fast.sampler.copy is not None and fast.sampler.copy.prepack
    assert torch.equal(batch["completion_ids"], expected["completion_ids"])
    # float32 samples the policy's own distribution: no behaviour-policy correction, as in TRL
    assert "sampling_per_token_logps" not in batch and "old_per_token_logps" not in batch
    # between generations the copy holds no weights: it would add the policy's size to the step's peak (docs/scale.md)
    assert all(p.numel() == 0 for p in fast.sampler.copy.copy.parameters())
    assert all(packed.packed is None for packed in fast.sampler.copy.prepacked.values())
    torch.manual_seed(3)
    again = generation_batch(fast, prompts=2)  # made again from the policy: the same completions
    assert torch.equal(again["completion_ids"], expected["completion_ids"])


@pytest.mark.skipif(BF16_PREPACK_UNSUPPORTED is not None, reason=str(BF16_PREPACK_UNSUPPORTED))
def test_with_bfloat16_generation_the_prepacked_copy_is_bfloat16_and_corrected(tmp_path):
    trainer = make_trainer(tmp_path, by_index, prompts=2, fast_generation=True, bfloat16_generation=True)
    batch = generation_batch(trainer, prompts=2)
    packed = next(iter(trainer.sampler.copy.prepacked.values()))
    assert isinstance(packed, PrepackedLinear) and packed.dtype == torch.bfloat16
    assert batch["old_per_token_logps"] is batch["sampling_per_token_logps"]


@pytest.fixture
def without_bf16_prepack(monkeypatch):
    """This CPU as one without AVX-512 BW/VL/DQ or AVX-NE-CONVERT (an AVX2-only AMD EPYC), through the user's lever."""
    monkeypatch.setenv(ONEDNN_BF16_ENV, "0")


def test_on_a_cpu_without_avx512_the_probe_reports_the_kernels_own_refusal():
    """oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA, read when it starts: a fresh process) is an AVX2-only CPU such as
    an AMD EPYC's: bfloat16 is refused with the kernel's own message, float32 still prepacks."""
    script = (
        "import torch; from grpo_exp.trainer.prepacked_linear import prepack_unsupported; "
        "print(prepack_unsupported(torch.bfloat16)); print(prepack_unsupported(torch.float32))"
    )
    env = {key: value for key, value in os.environ.items() if key != ONEDNN_BF16_ENV} | {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    bfloat16, float32 = result.stdout.splitlines()[-2:]
    assert bfloat16.startswith(f"{NO_AVX512}: mkldnn_reorder_linear_weight: bf16 path needs the cpu support")
    assert float32 == "None"


def test_the_cpu_probe_leaves_torch_s_random_generator_as_it_was():
    """The probe runs when a seeded trainer is built: a draw from the global generator would change its samples."""
    from grpo_exp.trainer.prepacked_linear import _probe_failure

    _probe_failure.cache_clear()
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    prepack_unsupported(torch.float32), prepack_unsupported(torch.bfloat16)
    assert torch.equal(torch.rand(4), expected)


def test_forced_off_bfloat16_is_unsupported_and_only_the_prepacked_copy_is_refused(tiny_policy, without_bf16_prepack):
    policy, _ = tiny_policy
    reason = prepack_unsupported(torch.bfloat16)
    assert reason == f"{NO_AVX512}: {ONEDNN_BF16_ENV}=0 turns bfloat16 prepacking off"
    assert prepack_unsupported(torch.float32) is None and sampling.can_prepack()
    with pytest.raises(RuntimeError, match=re.escape(reason)):
        SamplingCopy(policy, torch.bfloat16, prepack=True)
    assert not SamplingCopy(policy, torch.bfloat16).prepacked  # plain torch matmuls: any CPU
    assert SamplingCopy(policy, torch.float32, prepack=True).prepacked


def test_without_the_bfloat16_prepack_auto_turns_off_and_the_bfloat16_copy_trains(
    tmp_path, monkeypatch, caplog, without_bf16_prepack
):
    monkeypatch.setattr(sampling, "x86_64", lambda: True)  # where auto is on
    trainer = make_trainer(tmp_path, by_index, prompts=2, fast_generation=None, bfloat16_generation=True)
    assert trainer.sampler.fast
    trainer.train()  # 2 steps of the debug trainer
    assert not trainer.sampler.fast and not trainer.sampler.copy.prepack
    assert {p.dtype for p in trainer.sampler.copy.copy.parameters()} == {torch.bfloat16}
    assert f"trainer.fast_generation (auto) is off: with trainer.bfloat16_generation=true, {NO_AVX512}" in caplog.text
    losses = logged(trainer, "loss")
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert logged(trainer, "clip_ratio/region_mean")  # the loss's ratio is still taken against the copy


def test_without_the_bfloat16_prepack_a_bfloat16_policy_samples_itself(
    tmp_path, monkeypatch, caplog, without_bf16_prepack
):
    monkeypatch.setattr(sampling, "x86_64", lambda: True)
    trainer = make_trainer(tmp_path, by_index, prompts=2, fast_generation=None)
    trainer.model.to(torch.bfloat16)
    batch = generation_batch(trainer, prompts=2)
    assert not trainer.sampler.fast and trainer.sampler.copy is None and batch["completion_ids"].numel() > 0
    assert f"is off: with model.dtype=bfloat16, {NO_AVX512}" in caplog.text


def test_without_the_bfloat16_prepack_an_explicit_request_with_bfloat16_is_refused(tmp_path, without_bf16_prepack):
    trainer = make_trainer(tmp_path, by_index, prompts=2, fast_generation=True, bfloat16_generation=True)
    refusal = f"trainer.fast_generation=true: with trainer.bfloat16_generation=true, {NO_AVX512}: "
    advice = "; use trainer.fast_generation=false or drop trainer.bfloat16_generation=true"
    with pytest.raises(UserError, match=f"{re.escape(refusal)}.*{re.escape(advice)}"):
        trainer.train()


def test_by_default_it_is_on_where_it_was_measured_to_pay(tmp_path, monkeypatch):
    assert compose_config([]).trainer.fast_generation is None  # auto
    assert make_trainer(tmp_path, by_index, prompts=2, fast_generation=None).sampler.fast == sampling.x86_64()
    paged = make_trainer(
        tmp_path, by_index, prompts=2, fast_generation=None, overrides=["+trainer.extra.use_transformers_paged=true"]
    )
    assert not paged.sampler.fast  # TRL samples elsewhere: left to it
    monkeypatch.setattr(sampling, "x86_64", lambda: False)
    assert not make_trainer(tmp_path, by_index, prompts=2, fast_generation=None).sampler.fast
    assert make_trainer(tmp_path, by_index, prompts=2, fast_generation=True).sampler.fast  # asked for: on


def test_a_model_the_prepacked_copy_cannot_run_turns_auto_off_and_refuses_an_explicit_request(tmp_path, caplog):
    """peft's LoRA layers read their Linear's `.weight` in forward: the probe at the copy's creation catches it."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    auto = make_trainer(tmp_path, by_index, prompts=2, fast_generation=None, peft_config=lora)
    batch = generation_batch(auto, prompts=2)
    assert not auto.sampler.fast and auto.sampler.copy is None and batch["completion_ids"].numel() > 0
    assert "trainer.fast_generation (auto) is off" in caplog.text
    asked = make_trainer(tmp_path, by_index, prompts=2, fast_generation=True, peft_config=lora)
    with pytest.raises(UserError, match="trainer.fast_generation=true: the prepacked copy does not run this model"):
        generation_batch(asked, prompts=2)


def test_the_probe_catches_a_copy_whose_logits_differ(tiny_policy, monkeypatch):
    policy, tokenizer = tiny_policy
    probe = chat(tokenizer, "What is 2 + 3?")
    SamplingCopy(policy, torch.float32, prepack=True, probe=probe)  # agrees: no error
    original = PrepackedLinear.load
    monkeypatch.setattr(PrepackedLinear, "load", lambda self, weight: original(self, weight * 1.01))  # a wrong layout
    with pytest.raises(ValueError, match="logits differ"):
        SamplingCopy(policy, torch.float32, prepack=True, probe=probe)


def test_without_onednn_or_mkl_it_is_refused_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)  # a torch build without oneDNN
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)  # nor MKL (an aarch64 build)
    with pytest.raises(
        UserError, match=r"trainer.fast_generation .* no oneDNN \(mkldnn\) and no MKL.* generation=transformers"
    ):
        make_trainer(tmp_path, by_index, prompts=2, fast_generation=True)


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch build has no MKL (oneDNN packs float32)")
def test_with_mkl_and_without_onednn_float32_still_prepacks(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert prepack_unsupported(torch.float32) is None
    assert prepack_unsupported(torch.bfloat16) == "this torch build has no oneDNN (mkldnn)"


@pytest.mark.skipif(not mkl_packs(torch.float32), reason="this torch build has no MKL: oneDNN packs float32 weights")
def test_an_mkl_packed_layer_packs_for_each_decode_batch_and_multiplies_a_prefill_unpacked():
    """MKL packs for one number of rows: a decode step (one token a row) packs at its first call and again when the
    number of rows changes; a prefill multiplies the weight itself. Each is torch.nn.Linear's result, to rounding."""
    linear = torch.nn.Linear(48, 80)
    packed = PrepackedLinear(linear)
    assert packed.packed is None and packed.unpacked.data_ptr() == linear.weight.data_ptr()  # not a copy
    for shape, rows in [((4, 1, 48), 4), ((4, 1, 48), 4), ((6, 1, 48), 6), ((2, 9, 48), 6)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
        assert packed.packed_rows == rows  # a prefill (9 tokens) leaves the decode layout as it was
    packed.release()
    assert packed.packed is None and packed.unpacked is None


def test_the_copy_holds_no_second_float32_copy_of_the_policys_linear_weights(tiny_policy):
    """Where MKL packs, the copy multiplies a prefill by the policy's own weights (refreshed by each sync)."""
    policy, _ = tiny_policy
    fast = SamplingCopy(policy, torch.float32, prepack=True)
    fast.sync(policy, step=1)
    weights = {name: module.weight for name, module in policy.named_modules() if type(module) is torch.nn.Linear}
    for name, packed in fast.prepacked.items():
        if packed.mkl:
            assert packed.unpacked.data_ptr() == weights[name].data_ptr()
        else:
            assert packed.unpacked is None and packed.packed is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["generation=vllm_colocate", "trainer.fast_generation=true"],
            "trainer.fast_generation=true .*trainer.extra.use_vllm=true: vLLM samples instead",
        ),
        (
            ["generation=transformers_fast", "+trainer.extra.use_transformers_paged=true"],
            "use_transformers_paged=true: continuous batching samples instead",
        ),
    ],
)
def test_other_generation_paths_are_refused_with_it(overrides, message):
    with pytest.raises(UserError, match=message):
        check_trainer(compose_config(overrides).trainer, 1, multiturn=False, policy_dtype=torch.float32)


def test_multi_turn_rollouts_sample_their_turns_with_it():
    """The multi-turn loop samples from the prepacked copy (tests/test_rollout.py checks its log-probabilities)."""
    cfg = compose_config(["generation=transformers_fast", "rollout=multiturn"])
    check_trainer(cfg.trainer, 1, multiturn=True, policy_dtype=torch.float32)  # accepted


@pytest.mark.e2e
def test_the_command_line_trains_with_generation_transformers_fast(tmp_path):
    result = run_cli(
        *TINY_RUN,
        "logger=none",
        f"hydra.run.dir={tmp_path}",
        "generation=transformers_fast",
        "trainer.zero_variance_groups=keep",
        "eval.before=false",
        "eval.after=false",
    )
    assert result.returncode == 0, result.stderr
    trained = [s for s in logged_steps(tmp_path) if "loss" in s]
    assert trained and all(math.isfinite(s["loss"]) for s in trained)
