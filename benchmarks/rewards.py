"""Reward-head benchmark: `make bench` (python -m benchmarks.rewards).

1. math reward throughput (completions/s) on realistic completions, and its worst case on the adversarial set;
2. the judge's `openai` backend in free-text mode at concurrency 1 vs 8, measured side by side in one run, against
   (a) vLLM's OpenAI-compatible server on the embedded SmolLM2 (grpo-exp serve: a real model on these 2 cores), and
   (b) a stub endpoint with a fixed 0.2 s latency per request (a remote, network-bound judge).
"""

import asyncio
import os
import random
import statistics
import time

from grpo_exp.rewards.judge import build_judge, make_judge_reward
from grpo_exp.rewards.math import make_math_reward
from grpo_exp.verification.labels import built_in_labels
from support.config import resolved_config
from support.environment import hub_offline
from support.reward_cases import ADVERSARIAL
from support.servers import SERVED_EMBEDDED, free_port, stub_server, vllm_server

PAIRS = 32
STUB_LATENCY = 0.2


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def realistic_completions(n: int, seed: int = 0) -> tuple[list, list[str]]:
    """Completions shaped like SmolLM2's on the arithmetic task: boxed, plain, wrong, verbose."""
    rng = random.Random(seed)
    completions, references = [], []
    for _ in range(n):
        a, b = rng.randint(-99, 99), rng.randint(1, 99)
        answer = a + b if rng.random() < 0.7 else a + b + rng.randint(1, 9)
        style = rng.choice(
            [
                f"{a} + {b} = {answer}",
                f"To calculate {a} + {b}, we add the numbers. The result is \\boxed{{{answer}}}.",
                f"Let me think. {a} plus {b} gives {answer}.\n\nThe final answer is {answer}.",
                f"$${a} + {b} = \\frac{{{2 * answer}}}{{2}}$$",
            ]
        )
        completions.append(chat(style))
        references.append(str(a + b))
    return completions, references


def bench_math() -> None:
    reward = make_math_reward(built_in_labels())
    completions, references = realistic_completions(400)
    started = time.perf_counter()
    scores = reward(completions, references)
    elapsed = time.perf_counter() - started
    print(
        f"math reward: {len(scores) / elapsed:.0f} completions/s on {len(scores)} realistic completions "
        f"(mean reward {statistics.mean(scores):.2f})"
    )
    worst_name, worst = "", 0.0
    for name, text in ADVERSARIAL.items():
        started = time.perf_counter()
        reward([chat(text)], ["1"])
        seconds = time.perf_counter() - started
        if seconds > worst:
            worst_name, worst = name, seconds
        print(f"  adversarial {name:<22} {seconds:6.2f} s")
    print(
        f"math reward worst case: {worst:.2f} s for one completion ({worst_name}); "
        f"{worst / (elapsed / len(scores)):.0f}x a realistic completion"
    )


def judge_throughput(port: int, model: str, concurrency: int, max_new_tokens: int) -> tuple[float, int]:
    cfg = resolved_config(
        [
            "reward=judge",
            "judge=openai",
            f"judge.model={model}",
            f"judge.base_url=http://127.0.0.1:{port}/v1",
            f"judge.concurrency={concurrency}",
            f"judge.max_new_tokens={max_new_tokens}",
            "judge.retries=0",
            "judge.timeout=120",
            "judge.mode=text",
            "judge.response_format=none",
            "judge.cache_size=0",
        ]
    ).cfg
    reward = make_judge_reward(build_judge(cfg.judge, cfg.cache_dir))
    prompts = [[{"role": "user", "content": f"What is {i} + {i + 1}?"}] for i in range(PAIRS)]
    completions = [chat(f"{i} + {i + 1} = {2 * i + 1}") for i in range(PAIRS)]
    started = time.perf_counter()
    scores = asyncio.run(reward(prompts=prompts, completions=completions))
    return PAIRS / (time.perf_counter() - started), sum(s is not None for s in scores)


def bench_judge(label: str, server, port: int, model: str, max_new_tokens: int) -> None:
    with server:
        judge_throughput(port, model, 1, max_new_tokens)  # warm-up (model load, caches)
        rates = {}
        for concurrency in (1, 8, 1, 8):  # alternated, so that drift hits both alike
            rate, parsed = judge_throughput(port, model, concurrency, max_new_tokens)
            rates.setdefault(concurrency, []).append(rate)
    one, eight = statistics.mean(rates[1]), statistics.mean(rates[8])
    print(
        f"judge openai backend, {label}: {one:.2f} pairs/s at concurrency 1, {eight:.2f} at 8 "
        f"-> ratio {eight / one:.2f}x ({PAIRS} pairs per call, {parsed}/{PAIRS} replies parsed as rubric JSON)"
    )


def main() -> None:
    hub_offline()  # every model here is local: the servers it starts must not look anything up
    print(f"machine: {os.cpu_count()} CPUs")
    bench_math()
    port = free_port()
    bench_judge("vLLM server, SmolLM2-135M", vllm_server(port), port, SERVED_EMBEDDED, 48)
    port = free_port()
    stub = stub_server("good", port, env={**os.environ, "latency": str(STUB_LATENCY)})
    bench_judge(f"stub endpoint with {STUB_LATENCY} s latency", stub, port, "stub", 48)


if __name__ == "__main__":
    main()
