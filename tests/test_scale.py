"""The seed's scale (docs/scale.md): models of a real architecture's shape with random weights, the pre-load memory
estimate, and grpo_exp's tensors that grow with the vocabulary or the weights (chunked, or freed between uses)."""

import json
import logging
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from grpo_exp.errors import UserError
from grpo_exp.model_shapes import parameter_count, shape_config
from grpo_exp.models import load_tokenizer
from grpo_exp.run import memory_check, memory_estimate
from grpo_exp.run.memory_check import check_run_memory, estimate_run
from grpo_exp.run.memory_estimate import RunShape, estimate
from grpo_exp.run.resolve import resolve
from grpo_exp.token_log_probs import token_log_probs
from support.config import TINY_RUN, compose_config, resolved_config
from tests.helpers.cli import run_cli


def has_malloc_trim() -> bool:
    from grpo_exp.freed_memory import _malloc_trim

    return _malloc_trim() is not None


GIB = 2**30
LENGTH_REWARD = ["reward=length", "reward.components.length.target_chars=1000000"]  # a spread on any text
# Qwen2.5-0.5B's vocabulary and layout, narrowed to a test's size: what is under test is the 151,936-token vocabulary
SMALL_SHAPE = [
    "model=shape",
    "model.shape=qwen2.5-0.5b",
    "+model.architecture={num_hidden_layers: 1, hidden_size: 64, intermediate_size: 128, num_attention_heads: 4}",
]


@pytest.mark.parametrize(
    ("shape", "billions"), [("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544), ("qwen2.5-7b", 7.616)]
)
def test_a_shape_has_its_published_models_parameters(shape, billions):
    """Qwen2.5's model cards: 0.49B, 1.54B and 7.61B parameters (7B: untied embeddings, 152,064 tokens)."""
    assert parameter_count(shape_config(shape)) / 1e9 == pytest.approx(billions, abs=0.001)


def test_the_shapes_tokenizer_covers_every_id_and_decodes_each_to_text():
    cfg = compose_config(["model=shape", "model.shape=qwen2.5-0.5b"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    base = load_tokenizer(compose_config(["model=tiny"]).model, cfg.cache_dir)
    assert len(tokenizer) == shape_config("qwen2.5-0.5b").vocab_size == 151936
    padding = [len(base), 100_000, len(tokenizer) - 1]
    texts = [tokenizer.decode([i]) for i in padding]
    assert all(texts) and len(set(texts)) == len(texts)
    text = "What is 12 + 34? Answer: 46."  # ordinary text encodes as the embedded tokenizer does, and back
    assert tokenizer(text)["input_ids"] == base(text)["input_ids"]
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    chat = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == base.apply_chat_template(chat, tokenize=False)


def test_an_unknown_shape_is_refused_naming_the_key_and_the_shapes():
    with pytest.raises(UserError, match=r"model.shape=qwen9-1b: no such shape; the shapes: .*qwen2.5-1.5b"):
        resolved_config(["model=shape", "model.shape=qwen9-1b"])


def test_a_shape_with_another_model_is_refused_naming_both_keys():
    with pytest.raises(UserError, match=r"model.shape.*model.source=shape"):
        resolved_config(["model=tiny", "+model.shape=qwen2.5-0.5b"])


@pytest.mark.e2e
def test_a_shaped_model_trains_and_says_its_weights_are_random(tmp_path):
    result = run_cli(
        *TINY_RUN,
        *SMALL_SHAPE,
        *LENGTH_REWARD,
        "logger=none",
        "eval.before=false",
        "eval.after=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RANDOM WEIGHTS" in (tmp_path / "train.log").read_text()  # the log
    assert "RANDOM WEIGHTS" in result.stdout  # the printed summary
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and "RANDOM WEIGHTS in the shape of Qwen/Qwen2.5-0.5B-Instruct" in summary["model"]
    saved = json.loads((tmp_path / "checkpoint-final" / "config.json").read_text())
    assert saved["vocab_size"] == 151936 and saved["model_type"] == "qwen2"


# ---- the estimate ----------------------------------------------------------------------------------------------

SEED_SETTINGS = [*LENGTH_REWARD, "trainer.num_generations=8", "trainer.max_completion_length=512"]


def shape_of(**changes) -> RunShape:
    numbers = dict(
        parameters=494_032_768, hidden_size=896, intermediate_size=4864, layers=24, kv_size=128, vocab_size=151936,
        weight_bytes=4, compute_bytes=4, trainable=494_032_768, rows=16, tokens=563,
    )  # fmt: skip
    return RunShape(**(numbers | changes))


def test_the_estimate_counts_the_weights_gradients_and_adams_moments_and_grows_with_the_batch():
    small = estimate(shape_of(rows=1, tokens=1))
    weights = 494_032_768 * 4
    parts = small.parts
    assert parts["weights"] == weights and parts["gradients"] == weights and parts["optimiser moments"] == 2 * weights
    longer, larger = estimate(shape_of(tokens=1100)), estimate(shape_of(rows=32))
    assert estimate(shape_of()).total < longer.total and estimate(shape_of()).total < larger.total
    checkpointed = estimate(shape_of(gradient_checkpointing=True))
    assert checkpointed.parts["activations"] < estimate(shape_of()).parts["activations"] / 5


def test_the_backward_holds_every_activation_or_every_gradient_never_both_at_their_full_size():
    """It frees each layer's activations as it makes that layer's gradients: its peak is at its start (activations,
    the LM head's tiles and gradient) or at its end (all the gradients)."""
    long_batch = estimate(shape_of())  # 16 x 563 tokens, no checkpointing: 11 GiB of activations
    assert long_batch.peak_phase == "loss forward and backward" and "gradients" not in long_batch.parts
    assert long_batch.parts["LM head gradient"] == 151936 * 896 * 4
    short_batch = estimate(shape_of(rows=1, tokens=8))
    assert short_batch.peak_phase == "end of the backward" and "activations" not in short_batch.parts
    lora = estimate(shape_of(trainable=1_000_000))  # a frozen LM head has no gradient
    assert "LM head gradient" not in lora.parts


def test_the_shared_prompt_forward_counts_one_prompt_a_group_where_its_pack_is_short_enough_to_be_packed():
    """grpo_exp's loss forward packs a group's G completions behind one copy of its prompt (trainer.
    shared_prompt_forward): 2 groups of 8 x 128 tokens behind a 51-token prompt are 2 x (51 + 8 x 129) tokens, not
    16 x 179. A pack longer than the packing bound runs as TRL's rows."""
    rows = shape_of(rows=16, tokens=51 + 128, prompt_tokens=51)
    packed = replace(rows, packed_group=8)
    assert memory_estimate.loss_tokens(rows) == 16 * 179 and memory_estimate.loss_tokens(packed) == 2 * 1083
    ratio = memory_estimate.activation_bytes(packed) / memory_estimate.activation_bytes(rows)
    assert ratio == pytest.approx(2 * 1083 / (16 * 179))
    long_completions = replace(packed, tokens=51 + 512)  # 51 + 8 x 513 > MAX_PACKED_TOKENS
    assert memory_estimate.loss_tokens(long_completions) == 16 * 563
    split_group = replace(packed, rows=4)  # a process holding half a group (G=8 over two processes)
    assert memory_estimate.loss_tokens(split_group) == 51 + 4 * 129


def test_a_model_with_a_sliding_window_is_estimated_as_trls_rows():
    """The shared-prompt forward does not pack a windowed model: its estimate counts TRL's rows."""
    settings = {"weight_bytes": 4, "compute_bytes": 4, "rows": 16, "tokens": 179, "prompt_tokens": 51}
    config = shape_config("qwen2.5-0.5b")
    assert memory_estimate.run_shape(config, 1, settings | {"packed_group": 8}).packed_group == 8
    windowed = shape_config("qwen2.5-0.5b", {"use_sliding_window": True, "sliding_window": 4096})
    assert memory_estimate.run_shape(windowed, 1, settings | {"packed_group": 8}).packed_group == 0


def test_a_copy_freed_between_generations_counts_at_generation_only():
    """The sampling copy is held while a batch is generated (no gradients, no activations then): it raises the peak
    only where generation is the largest phase."""
    copy = {"sampling copy": 494_032_768 * 8}  # the float64 reference's
    assert estimate(shape_of(copies=copy)).total == estimate(shape_of()).total  # the loss phase is larger
    tiny_batch = shape_of(rows=1, tokens=8)
    with_copy = estimate(shape_of(rows=1, tokens=8, copies=copy))
    assert with_copy.peak_phase == "generation" and with_copy.total > estimate(tiny_batch).total


def test_a_run_that_would_not_fit_is_refused_before_any_model_loads_naming_what_would(
    monkeypatch, no_model_loads, caplog
):
    monkeypatch.setattr(memory_check, "available_bytes", lambda on_gpu: (16 * GIB, "available on this machine"))
    spec = resolved_config(["model=shape", "model.shape=qwen2.5-0.5b", *SEED_SETTINGS])
    prompts = [[{"role": "user", "content": "What is 2 + 2?"}]]
    tokenizer = load_tokenizer(spec.cfg.model, spec.cfg.cache_dir)
    with pytest.raises(UserError) as refused:
        check_run_memory(spec, prompts, tokenizer)
    message = str(refused.value)
    assert "more than the 16.0 GiB available on this machine" in message and "activations" in message
    for remedy in ("+trainer.extra.gradient_checkpointing=true", "trainer.max_completion_length=", "health.memory"):
        assert remedy in message
    warned = resolved_config(["model=shape", "model.shape=qwen2.5-0.5b", *SEED_SETTINGS, "health.memory=warn"])
    with caplog.at_level(logging.WARNING):
        assert check_run_memory(warned, prompts, tokenizer) is not None
    assert "more than the 16.0 GiB" in caplog.text
    fits = resolve(compose_config(["model=shape", "model.shape=qwen2.5-0.5b", *LENGTH_REWARD]), processes=1)
    assert check_run_memory(fits, prompts, tokenizer).total_gib < 16


def test_a_warm_ups_sft_step_is_a_phase_its_whole_logits_counted_and_bounded_by_its_micro_batch():
    """TRL's SFTTrainer computes its loss from the whole logits (about 5 float32 copies of rows x length x
    vocabulary): 8 demonstrations of 1,024 tokens at a 150k vocabulary peak far above the GRPO step; a row at a time,
    an eighth of those logits, the gradients held across the accumulated rows."""
    grpo = estimate(shape_of(gradient_checkpointing=True))
    warm = estimate(shape_of(gradient_checkpointing=True, warmup_rows=8, warmup_tokens=1024))
    assert warm.peak_phase == "warm-up (SFT)" and warm.total > grpo.total
    assert warm.parts["logits"] == int(5.25 * 8 * 1024 * 151936 * 4)
    assert "reference model" not in warm.parts  # GRPO's trainer does not exist yet
    a_row = {"warmup_rows": 1, "warmup_tokens": 1024, "warmup_accumulates": True}
    one_row = estimate(shape_of(gradient_checkpointing=True, **a_row))
    assert 8 * one_row.parts["logits"] == pytest.approx(warm.parts["logits"], rel=1e-6)
    assert one_row.phases["warm-up (SFT)"] < warm.phases["warm-up (SFT)"] and "gradients" in one_row.parts
    assert estimate(shape_of()).phases.keys() == grpo.phases.keys()  # no warm-up, no phase


def test_a_warm_up_that_would_not_fit_names_its_micro_batch(tmp_path, no_model_loads):
    data = tmp_path / "conversations.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n')
    checkpointed = ["+trainer.extra.gradient_checkpointing=true", "warmup=sft", "warmup.source=dataset"]
    settings = ["model=shape", "model.shape=qwen2.5-1.5b", *SEED_SETTINGS, *checkpointed, f"warmup.data={data}"]
    run = estimate_run(resolved_config(settings), prompt_tokens=100)
    assert run.estimate.peak_phase == "warm-up (SFT)" and run.shape.warmup_tokens == 1024  # a conversation's most
    assert "warmup.micro_batch_size=1" in run.remedies(resolved_config(settings).cfg, 40 * GIB)
    one_row = estimate_run(resolved_config([*settings, "warmup.micro_batch_size=1"]), prompt_tokens=100)
    assert one_row.shape.warmup_accumulates and one_row.estimate.total < run.estimate.total


def test_lora_at_7b_is_what_the_estimate_names_where_full_fine_tuning_cannot_fit(monkeypatch):
    spec = resolved_config(["model=shape", "model.shape=qwen2.5-7b", *SEED_SETTINGS])
    run = estimate_run(spec, prompt_tokens=100)
    assert run.total_gib > 100  # float32 weights, gradients and moments of 7.6B parameters
    # no one setting fits it into 40 GiB; gradient checkpointing and LoRA together do
    assert run.remedies(spec.cfg, 40 * GIB) == ["+trainer.extra.gradient_checkpointing=true model.lora.enabled=true"]
    lora_settings = ["model.lora.enabled=true", "model.dtype=bfloat16", "+trainer.extra.gradient_checkpointing=true"]
    lora = estimate_run(resolved_config(["model=shape", "model.shape=qwen2.5-7b", *SEED_SETTINGS, *lora_settings]), 100)
    assert lora.shape.trainable < 0.01 * lora.shape.parameters and lora.total_gib < 40


@pytest.mark.parametrize(
    ("setting", "available_gib", "on_gpu", "handed_back"),
    [
        (None, 24, False, True),  # the 0.5B shape at G=8 x 512 tokens: over a third of 24 GiB
        (None, 100, False, False),  # memory is plenty: glibc's default, faster
        (None, 24, True, False),  # on a GPU the host's resident set is not what decides whether a run fits
        (True, 100, False, True),
        (False, 24, False, False),
    ],
)
def test_freed_tensors_go_back_at_once_where_the_run_takes_a_large_share_of_the_memory(
    monkeypatch, caplog, setting, available_gib, on_gpu, handed_back
):
    import dataclasses

    import grpo_exp.freed_memory

    calls = []
    monkeypatch.setattr(grpo_exp.freed_memory, "return_large_blocks_when_freed", lambda: calls.append(1) or True)
    monkeypatch.setattr(memory_check, "available_bytes", lambda on_gpu: (available_gib * GIB, "available"))
    run = estimate_run(resolved_config(["model=shape", "model.shape=qwen2.5-0.5b", *SEED_SETTINGS]), 51)
    run = dataclasses.replace(run, shape=dataclasses.replace(run.shape, on_gpu=on_gpu))
    with caplog.at_level("INFO", logger="grpo_exp.run.memory_check"):
        memory_check.hand_back_freed_memory(setting, run)
    assert bool(calls) is handed_back
    assert ("go back to the system at once" in caplog.text) is handed_back


# ---- grpo_exp's own log-probabilities, in chunks ------------------------------------------------------------------


FREED_BUT_RESIDENT = """
import torch
from grpo_exp.freed_memory import return_freed_memory

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

raise_threshold = torch.ones(4_000_000)
del raise_threshold  # a freed 16 MB block raises glibc's mmap threshold to 16 MB, as any training run's do
blocks = [torch.ones(250_000) for _ in range(400)]  # 400 MB in 1 MB tensors: from the heap now
last = torch.ones(10)  # a live block above them: free() cannot give the heap's top back
before = resident()
del blocks
freed = resident()
return_freed_memory()
print(before - freed, freed - resident())
"""


@pytest.mark.skipif(not has_malloc_trim(), reason="glibc's malloc_trim only (Linux with glibc)")
def test_weights_freed_between_uses_leave_the_resident_set():
    """A copy of the weights freed (SamplingCopy.release) leaves glibc's heap holding its pages: they stay in the
    resident set, and on the next phase's peak, until return_freed_memory gives them back. Measured in a fresh
    process, whose heap nothing else shares."""
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", FREED_BUT_RESIDENT], capture_output=True, text=True, check=True)
    kept_after_free, given_back = (int(n) for n in ran.stdout.split())
    assert kept_after_free < 50 * 2**20 and given_back > 300 * 2**20, ran.stdout


LARGE_BLOCKS_FREED = """
import torch
from grpo_exp.freed_memory import return_large_blocks_when_freed

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

assert return_large_blocks_when_freed()
raise_threshold = torch.ones(4_000_000)
del raise_threshold  # without the fixed threshold: 16 MB, and the 2 MB tensors below would come from the heap
blocks = [torch.ones(500_000) for _ in range(200)]  # 400 MB in 2 MB tensors
last = torch.ones(10)
before = resident()
del blocks
print(before - resident())
"""


@pytest.mark.skipif(not has_malloc_trim(), reason="glibc's mallopt(M_MMAP_THRESHOLD) only (Linux with glibc)")
def test_large_tensors_leave_the_resident_set_when_freed_with_the_threshold_fixed():
    """With glibc's mmap threshold fixed at 1 MiB (return_large_blocks_when_freed, set before the policy loads), a
    freed tensor of 2 MB leaves the resident set at once, where glibc's rising threshold would have kept it (the
    test above). Measured in a fresh process."""
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", LARGE_BLOCKS_FREED], capture_output=True, text=True, check=True)
    assert int(ran.stdout) > 350 * 2**20, ran.stdout


def test_the_float64_references_log_probabilities_in_chunks_equal_the_whole_vocabularys_log_softmax():
    config = LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    ids = torch.randint(0, 300, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    targets = ids[:, -7:]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -8:-1] / 0.7
    expected = torch.log_softmax(logits, dim=-1).gather(2, targets[..., None]).squeeze(2)
    chunked = token_log_probs(model, ids, mask, targets, temperature=0.7, chunk_tokens=4)
    assert chunked.dtype == torch.float64
    torch.testing.assert_close(chunked, expected)


@pytest.mark.e2e
def test_gradient_checkpointing_trains_with_grpo_exps_features_on(tmp_path):
    """What users set at size, with the sampling copy, the shared-prompt forward, the mismatch metrics and the float64
    reference all on: the run trains, and the trainer's forward is measured against the sampler's as without it."""
    result = run_cli(
        *TINY_RUN,
        *LENGTH_REWARD,
        "logger=none",
        "eval.before=false",
        "+trainer.extra.gradient_checkpointing=true",
        "trainer.shared_prompt_forward=true",
        "trainer.mismatch_metrics=true",
        "trainer.float64_reference_every=1",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["steps"] == 2
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [m for m in steps if "sampling/sampling_logp_difference/mean" in m]
    assert len(logged) == 2 and all(m["sampling/sampling_logp_difference/mean"] < 1e-4 for m in logged)
    assert all(m["sampling/float64/trainer_logp_difference/mean"] < 1e-4 for m in logged)


def test_an_architecture_the_estimate_cannot_read_is_trained_without_an_estimate(monkeypatch, caplog):
    def unreadable(*args, **kwargs):
        raise AttributeError("'GPT2Config' object has no attribute 'intermediate_size'")

    monkeypatch.setattr(memory_check, "estimate_run", unreadable)
    spec = resolved_config(["model=tiny"])
    tokenizer = load_tokenizer(spec.cfg.model, spec.cfg.cache_dir)
    with caplog.at_level(logging.INFO):
        assert check_run_memory(spec, [[{"role": "user", "content": "hi"}]], tokenizer) is None
    assert "Memory: not estimated for model=tiny (AttributeError" in caplog.text


def test_a_run_whose_generation_is_served_elsewhere_holds_no_kv_cache():
    """generation=vllm_server: the server holds the KV cache, not the training process."""
    config = shape_config("qwen2.5-0.5b")
    settings = {"weight_bytes": 4, "compute_bytes": 4, "rows": 16, "tokens": 563}
    here = estimate(memory_estimate.run_shape(config, 494_032_768, settings)).phases["generation"]
    served = estimate(memory_estimate.run_shape(config, 494_032_768, settings | {"generates": False}))
    kv_cache = 2 * 24 * 128 * 16 * 563 * 4
    assert here - served.phases["generation"] == kv_cache
