"""The judge's targets, measured side by side in one run: `make bench` (python -m benchmarks.judge).

On real training-step inputs (the embedded SmolLM2 policy samples one default step: 2 arithmetic prompts x 4
completions of up to 64 tokens, at temperature 1), with the embedded SmolLM2 as the stand-in judge:
1. failures: score-token mode vs free-text mode, locally, and score-token mode through vLLM's server (grpo-exp serve);
2. cost: the local judge's seconds per step in each mode over the generation seconds of the same step;
3. agreement: the same pairs scored locally and by vLLM serving the same model (largest difference).
"""

import asyncio
import os
import statistics
import time

import torch

from grpo_exp.data import load_splits
from grpo_exp.generation import generate_completions
from grpo_exp.rewards.judge import build_judge
from grpo_exp.run.setup import load_policy
from grpo_exp.text import prompt_text
from support.config import resolved_config
from support.environment import hub_offline
from support.servers import free_port, served_judge_overrides, vllm_server

STEPS, PROMPTS, GROUP, TOKENS = 3, 2, 4, 64


def step_pairs(model, tokenizer, problems, step: int) -> tuple[list[tuple[str, str]], float]:
    """One training step's (prompt, completion) pairs, and the seconds their generation took."""
    prompts = [p for p in problems["prompt"][step * PROMPTS : (step + 1) * PROMPTS] for _ in range(GROUP)]
    started = time.perf_counter()
    texts = generate_completions(model, tokenizer, prompts, TOKENS, len(prompts), None, temperature=1.0)
    return [(prompt_text(p), t) for p, t in zip(prompts, texts, strict=True)], time.perf_counter() - started


def judge_seconds(judge, pairs) -> tuple[list[float | None], float]:
    judge.cache.clear()  # every step's pairs are new to it, as in training
    started = time.perf_counter()
    rewards, _ = asyncio.run(judge.score(pairs))
    return rewards, time.perf_counter() - started


def main() -> None:
    hub_offline()  # every model here is local: the vLLM server it starts must not look anything up
    torch.manual_seed(0)
    spec = resolved_config([])
    cfg = spec.cfg
    tokenizer, policy = load_policy(spec)
    train, _ = load_splits(cfg.dataset)
    variants = {
        "scores": ["judge.mode=scores"],
        "scores, bfloat16": ["judge.mode=scores", "judge.dtype=bfloat16"],
        "text": ["judge.mode=text"],
    }
    judges = {
        name: build_judge(resolved_config(["reward=judge", *overrides]).cfg.judge, cfg.cache_dir)
        for name, overrides in variants.items()
    }
    for judge in judges.values():
        judge_seconds(judge, [("warm-up", "load the judge model once")])
    print(f"machine: {os.cpu_count()} CPUs; {STEPS} steps of {PROMPTS} prompts x {GROUP} completions, {TOKENS} tokens")
    generation, all_pairs = [], []
    seconds, failures, local = {name: [] for name in judges}, dict.fromkeys(judges, 0), {name: [] for name in judges}
    for step in range(STEPS):
        pairs, spent = step_pairs(policy, tokenizer, train, step)
        generation.append(spent)
        all_pairs += pairs
        for mode, judge in judges.items():
            rewards, spent = judge_seconds(judge, pairs)
            seconds[mode].append(spent)
            failures[mode] += sum(r is None for r in rewards)
            local[mode] += rewards
    n, gen = len(all_pairs), statistics.mean(generation)
    print(f"generation of a step: {gen:.2f} s (mean of {STEPS})")
    for mode in judges:
        cost = statistics.mean(seconds[mode])
        print(
            f"local judge, {mode} mode: {failures[mode]}/{n} failures; {cost:.2f} s per step = {cost / gen:.2f}x "
            "the step's generation time"
        )
    port = free_port()
    endpoint = resolved_config(served_judge_overrides(f"http://127.0.0.1:{port}"))
    with vllm_server(port):
        served, spent = judge_seconds(build_judge(endpoint.cfg.judge, endpoint.cfg.cache_dir), all_pairs)
    print(f"vLLM server, scores mode: {sum(s is None for s in served)}/{n} failures ({spent:.1f} s for {n} pairs)")
    for mode in ("scores", "scores, bfloat16"):
        gaps = [abs(a - b) for a, b in zip(local[mode], served, strict=True) if a is not None and b is not None]
        print(
            f"  local ({mode}) vs served reward: largest difference {max(gaps):.4f}, mean "
            f"{statistics.mean(gaps):.4f} over {len(gaps)} pairs"
        )


if __name__ == "__main__":
    main()
