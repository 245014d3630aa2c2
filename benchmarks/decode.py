"""Decode speed of each generation path: `python -m benchmarks.decode` (part of `make bench`).

Milliseconds per token-step (one new token for every sequence of the batch) with the embedded SmolLM2-135M, at
batch 8 (the default step: 2 prompts x G=4, sampled at temperature 1) and at batch 1. Each path generates
exactly 8 and then 72 new tokens for the same prompts (EOS ignored); the difference over 64 steps is the decode
cost, prefill excluded. Then a whole step's generation at batch 8 (prefill included, 64 new tokens), TRL's against
the sampling copy's (MKL's and oneDNN's kernels), whose prefill is computed once per prompt. Paths, all in one
process, one after another:

- transformers, float32: what TRL's own generation does in the default run (on-policy);
- transformers, bfloat16: the same weights rounded to bfloat16 (half the bytes read per step);
- transformers, static KV cache with torch.compile: generate()'s compiled decoding;
- grpo_exp's sampling copy (trainer.fast_generation): float32 with Linear weights packed for MKL's sgemm (on-policy;
  where torch has MKL), the same laid out for oneDNN's matmul instead (GRPO_EXP_MKL_PACK=0, the kernel before MKL's),
  and oneDNN's in bfloat16 (with trainer.bfloat16_generation; skipped, with the reason, on a CPU without AVX-512
  BW/VL/DQ or AVX-NE-CONVERT);
- transformers continuous batching (`generate_batch`, paged attention: TRL's use_transformers_paged), float32;
- llama.cpp (llama-cpp-python: `make llama-cpp` compiles it; skipped without it), the packaged Q4_1 GGUF: batch 1
  through its high-level API (the engine the issue compared against), and batch 8 as 8 sequences of one llama.cpp
  batch (its low-level API, a unified KV cache), sampled at temperature 1 in numpy from each sequence's logits.

    python -m benchmarks.decode [--repeats 2]
"""

import argparse
import contextlib
import functools
import importlib.util
import os
import statistics
import time
from unittest import mock

import torch
from transformers import GenerationConfig

from grpo_exp.models import gguf_location, load_tokenizer, materialise_embedded
from grpo_exp.trainer.prepacked_linear import MKL_PACK_ENV, prepack_unsupported
from grpo_exp.trainer.sampling_copy import SamplingCopy
from support.config import resolved_config

QUESTIONS = [(12, 34), (56, 7)]
LLAMA_CPP_PROMPT = f"What is {QUESTIONS[0][0]} + {QUESTIONS[0][1]}?"  # llama.cpp paths: a raw prompt, no template


def prompts(tokenizer, batch: int) -> dict:
    messages = [
        [{"role": "user", "content": f"What is {a} + {b}?\nPut your final answer within \\boxed{{}}."}]
        for a, b in QUESTIONS
    ]
    texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    texts = [texts[i * len(texts) // batch] for i in range(batch)]  # G copies of each prompt, as TRL batches them
    tokenizer.padding_side = "left"
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def decode_ms(seconds, repeats: int) -> float:
    """ms per token-step from `seconds(new_tokens)`: 72 minus 8 new tokens over 64 steps (prefill cancels out),
    after one warm-up (and compilation, for the static cache); the median of `repeats`."""
    seconds(8)
    return statistics.median((seconds(72) - seconds(8)) / 64 * 1000 for _ in range(repeats))


def transformers_ms(model, tokenizer, batch: int, repeats: int, **options) -> float:
    inputs = prompts(tokenizer, batch)
    settings = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id)

    def seconds(tokens: int) -> float:
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, **settings, **options)
        return time.perf_counter() - started

    return decode_ms(seconds, repeats)


# The sampling copy's float32 Linear layers laid out for oneDNN, not MKL (GRPO_EXP_MKL_PACK=0), while inside.
onednn_float32 = functools.partial(mock.patch.dict, os.environ, {MKL_PACK_ENV: "0"})


def step_generation_seconds(policy, tokenizer, repeats: int) -> tuple[float, float, float]:
    """A default step's generation (2 prompts x G=4, 64 new tokens, prefill included): the policy's generate(), as
    TRL calls it, against generation=transformers_fast's copy (prepacked, prefill once per prompt), its float32
    weights packed for MKL (the default where torch has MKL) and laid out for oneDNN."""
    inputs = prompts(tokenizer, 8)
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=64,
        min_new_tokens=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id],
    )
    rows = [row[mask.bool()].tolist() for row, mask in zip(inputs["input_ids"], inputs["attention_mask"], strict=True)]
    fast = SamplingCopy(policy, torch.float32, prepack=True)
    with onednn_float32():
        onednn = SamplingCopy(policy, torch.float32, prepack=True)

    def seconds(generate) -> float:
        generate()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            with torch.no_grad():
                generate()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    plain = seconds(lambda: policy.generate(**inputs, generation_config=config))
    packed = [seconds(lambda copy=copy: copy.generate(rows, config, with_log_probs=False)) for copy in (fast, onednn)]
    return plain, *packed


def continuous_batching_ms(model, tokenizer, batch: int, repeats: int) -> float:
    ids = prompts(tokenizer, batch)
    rows = [row[mask.bool()].tolist() for row, mask in zip(ids["input_ids"], ids["attention_mask"], strict=True)]

    def seconds(tokens: int) -> float:
        config = GenerationConfig(
            max_new_tokens=tokens,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            eos_token_id=None,
            pad_token_id=tokenizer.pad_token_id,
        )
        started = time.perf_counter()
        with torch.no_grad():
            model.generate_batch(rows, generation_config=config, progress_bar=False)
        return time.perf_counter() - started

    return decode_ms(seconds, repeats)


def llama_cpp_ms(gguf: str, repeats: int) -> float:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=512, n_threads=torch.get_num_threads(), verbose=False)
    no_eos = {llm.token_eos(): -1e9}

    def seconds(tokens: int) -> float:
        started = time.perf_counter()
        llm.create_completion(LLAMA_CPP_PROMPT, max_tokens=tokens, temperature=1.0, seed=0, logit_bias=no_eos)
        return time.perf_counter() - started

    return decode_ms(seconds, repeats)


def llama_cpp_batched_ms(gguf: str, batch: int, repeats: int) -> float:
    """8 sequences decoded together: one llama_decode per token-step for the whole batch."""
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama
    from llama_cpp._internals import LlamaBatch, LlamaContext

    threads = torch.get_num_threads()
    llm = Llama(model_path=gguf, n_ctx=256, n_threads=threads, verbose=False)  # loads the weights
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 128 * batch, 512, 512, batch
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = True
    context = LlamaContext(model=llm._model, params=params, verbose=False)
    work = LlamaBatch(n_tokens=512, embd=0, n_seq_max=batch, verbose=False)
    prompt = llm.tokenize(LLAMA_CPP_PROMPT.encode(), add_bos=True)
    vocab, rng = llm.n_vocab(), np.random.default_rng(0)

    def seconds(tokens: int) -> float:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context.ctx), True)
        started = time.perf_counter()
        work.reset()
        for sequence in range(batch):
            work.add_sequence(prompt, sequence, False)
        last = [len(prompt) * (sequence + 1) - 1 for sequence in range(batch)]  # each prompt's last token
        for step in range(tokens):
            if llama_cpp.llama_decode(context.ctx, work.batch) != 0:
                raise RuntimeError("llama_decode failed")
            logits = np.stack(
                [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(context.ctx, i), shape=(vocab,)) for i in last]
            )
            probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities /= probabilities.sum(axis=1, keepdims=True)
            chosen = [int(rng.choice(vocab, p=row)) for row in probabilities]
            work.reset()
            for sequence, token in enumerate(chosen):
                work.batch.token[sequence], work.batch.pos[sequence] = token, len(prompt) + step
                work.batch.seq_id[sequence][0], work.batch.n_seq_id[sequence] = sequence, 1
                work.batch.logits[sequence] = True
            work.batch.n_tokens, last = batch, list(range(batch))
        return time.perf_counter() - started

    return decode_ms(seconds, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = resolved_config().cfg
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    checkpoint = materialise_embedded(cfg.model, cfg.cache_dir)
    print(
        f"decode, embedded SmolLM2-135M, {torch.get_num_threads()} threads, ms per token-step (median of "
        f"{args.repeats}):"
    )
    rows = []
    for label, dtype, options in [
        ("transformers float32 (TRL's generation, on-policy)", torch.float32, {}),
        ("transformers bfloat16", torch.bfloat16, {}),
        ("transformers float32, static cache + torch.compile", torch.float32, {"cache_implementation": "static"}),
    ]:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
        for batch in (8, 1):
            ms = transformers_ms(model, tokenizer, batch, args.repeats, **options)
            rows.append((label, batch, ms))
            print(f"  {label:55s} batch {batch}: {ms:6.1f} ms", flush=True)
    policy = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    for label, dtype, kernels in [
        ("sampling copy, float32 prepacked (transformers_fast, on-policy)", torch.float32, contextlib.nullcontext),
        ("sampling copy, float32 prepacked for oneDNN (MKL_PACK=0)", torch.float32, onednn_float32),
        ("sampling copy, bfloat16 prepacked (fast + bf16)", torch.bfloat16, contextlib.nullcontext),
    ]:
        with kernels():
            unsupported = prepack_unsupported(dtype)  # bfloat16: AVX-512 BW/VL/DQ or AVX-NE-CONVERT
            copy = None if unsupported else SamplingCopy(policy, dtype, prepack=True).copy
        if unsupported is not None:
            print(f"  {label:55s} skipped: {unsupported}", flush=True)
            continue
        for batch in (8, 1):
            ms = transformers_ms(copy, tokenizer, batch, args.repeats)
            rows.append((label, batch, ms))
            print(f"  {label:55s} batch {batch}: {ms:6.1f} ms", flush=True)
    plain, fast, onednn = step_generation_seconds(policy, tokenizer, args.repeats)
    print(
        f"  a step's generation, 8 x 64 new tokens, prefill included: TRL's {plain:.2f} s, transformers_fast "
        f"{fast:.2f} s ({fast / plain:.2f}x), its float32 laid out for oneDNN {onednn:.2f} s ({onednn / plain:.2f}x)"
    )
    label = "transformers continuous batching (generate_batch), float32"
    try:
        ms = continuous_batching_ms(policy, tokenizer, 8, args.repeats)
        rows.append((label, 8, ms))
        print(f"  {label:55s} batch 8: {ms:6.1f} ms", flush=True)
    except Exception as err:  # an engine that does not run here is a result too
        print(f"  {label:55s} batch 8: did not run ({type(err).__name__}: {str(err)[:200]})", flush=True)
    package_dir, name = gguf_location(cfg.model)
    if importlib.util.find_spec("llama_cpp") is None:  # it compiles for minutes: installed by `make llama-cpp` only
        print(f"  {'llama.cpp, Q4_1 GGUF (llama-cpp-python)':55s} skipped: not installed (make llama-cpp)", flush=True)
    else:
        ms = llama_cpp_ms(str(package_dir / name), args.repeats)
        print(f"  {'llama.cpp, Q4_1 GGUF (llama-cpp-python)':55s} batch 1: {ms:6.1f} ms", flush=True)
        label = "llama.cpp, Q4_1 GGUF, one batch of 8 sequences"
        ms = llama_cpp_batched_ms(str(package_dir / name), 8, args.repeats)
        rows.append((label, 8, ms))
        print(f"  {label:55s} batch 8: {ms:6.1f} ms", flush=True)
    base = next(ms for label, batch, ms in rows if batch == 8 and "float32 (TRL" in label)
    for label, batch, ms in rows:
        if batch == 8:
            print(f"  batch 8, {label}: {ms / base:.2f}x TRL's generation (target: <= 40 ms)")


if __name__ == "__main__":
    main()
