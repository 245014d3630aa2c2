"""vLLM against grpo_exp's prepacked float32 copy, side by side in one run: `python -m benchmarks.vllm`.

1. A default step's generation (2 prompts x G=4, sampled at temperature 1, exactly 64 new tokens, prefill included),
   in this process, alternating over repeats: the prepacked copy (generation=transformers_fast, the CPU default),
   vLLM in float32 (generation=vllm_colocate) and vLLM in bfloat16 (trainer.bfloat16_generation=true with it).
2. Whole training steps through the command line (fresh processes, no evaluation, the median of TRL's step_time
   after the first step): the default single-turn run, the calculator preset (multi-turn tools) and TextArena's
   GuessTheNumber (an environment), each on the CPU default, through vLLM in float32 and in bfloat16 (with the
   correction), and the ratio multi-turn / single-turn on each.

    python -m benchmarks.vllm [--repeats 5] [--steps 5]
"""

import argparse
import os
import statistics
import time

import torch
from transformers import GenerationConfig

from benchmarks.decode import prompts
from benchmarks.heldout_eval import cpu_name
from benchmarks.multiturn_speed import training_seconds_per_step

NEW_TOKENS = 64


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    print(f"vLLM against the prepacked copy, embedded SmolLM2-135M, {cpu_name()}, {torch.get_num_threads()} threads")
    if args.repeats:
        step_generation(args.repeats)
    if args.steps:
        training_steps(args.steps)


def step_generation(repeats: int) -> None:
    from vllm import LLM, SamplingParams

    from grpo_exp.models import load_model, load_tokenizer
    from grpo_exp.trainer.sampling_copy import SamplingCopy
    from support.config import compose_config

    cfg = compose_config()
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    policy = load_model(cfg.model, tokenizer, cfg.cache_dir, seed=0).eval()
    inputs = prompts(tokenizer, 8)
    rows = [row[mask.bool()].tolist() for row, mask in zip(inputs["input_ids"], inputs["attention_mask"], strict=True)]
    config = GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=[tokenizer.eos_token_id],
    )  # fmt: skip
    copy = SamplingCopy(policy, torch.float32, prepack=True)
    sampling = SamplingParams(
        temperature=1.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0
    )
    print(f"\na default step's generation (8 completions x {NEW_TOKENS} tokens), median of {repeats}, alternating")
    print("| path | seconds | the prepacked copy, beside it (s) | against the copy | every repeat (s) |")
    print("|---|---|---|---|---|")
    for dtype in ("float32", "bfloat16"):  # one engine at a time; the copy measured beside each
        llm = LLM(
            model=policy.name_or_path, dtype=dtype, max_num_batched_tokens=4096, logprobs_mode="processed_logprobs"
        )
        paths = {
            "copy": lambda: copy.generate(rows, config, with_log_probs=False),
            "vllm": lambda llm=llm: llm.generate([{"prompt_token_ids": row} for row in rows], sampling, use_tqdm=False),
        }
        times = timed(paths, repeats)
        vllm, beside = statistics.median(times["vllm"]), statistics.median(times["copy"])
        every = ", ".join(f"{t:.2f}" for t in times["vllm"])
        print(f"| vLLM, {dtype} | {vllm:.2f} | {beside:.2f} | {vllm / beside:.2f}x | {every} |", flush=True)
        del llm, paths


def timed(paths: dict, repeats: int) -> dict[str, list[float]]:
    """Each path's seconds over `repeats`, the paths alternating, after one warm-up each (vLLM compiles then)."""
    for generate in paths.values():
        generate()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, generate in paths.items():
            started = time.perf_counter()
            with torch.no_grad():
                generate()
            times[name].append(time.perf_counter() - started)
    return times


PATHS = {
    "CPU default (prepacked copy)": [],
    "vLLM, float32": ["generation=vllm_colocate"],
    "vLLM, bfloat16 (corrected)": ["generation=vllm_colocate", "trainer.bfloat16_generation=true"],
}
PRESETS = {"default (single-turn)": None, "calculator (multi-turn)": "calculator", "TextArena": "textarena_guess"}


def training_steps(steps: int) -> None:
    """Each preset on each generation path, one command line at a time; the presets' order within a path is fixed
    and the paths run one after the other (a step's time is TRL's own step_time, so start-up is not counted)."""
    print(f"\ntraining steps through the command line ({steps} steps, median step_time after the first)")
    seconds = {(path, preset): 0.0 for path in PATHS for preset in PRESETS}
    for path, overrides in PATHS.items():
        for preset, name in PRESETS.items():
            seconds[path, preset] = training_seconds_per_step(name, steps, overrides)
            print(f"  {path}, {preset}: {seconds[path, preset]:.2f} s/step", flush=True)
    print(f"| generation | {' | '.join(f'{p} (s/step)' for p in PRESETS)} | calculator / single-turn |")
    print("|---|" + "---|" * (len(PRESETS) + 1))
    for path in PATHS:
        row = [seconds[path, preset] for preset in PRESETS]
        print(f"| {path} | {' | '.join(f'{s:.2f}' for s in row)} | {row[1] / row[0]:.2f}x |")
    copy = "CPU default (prepacked copy)"
    for path in list(PATHS)[1:]:
        against = ", ".join(f"{p} {seconds[path, p] / seconds[copy, p]:.2f}x" for p in PRESETS)
        print(f"{path} against the copy, step for step: {against}")


if __name__ == "__main__":
    main()
