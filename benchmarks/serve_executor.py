"""`grpo-exp serve` on CPU with the model in vLLM's engine process (the `uni` executor, with
VLLM_ENABLE_V1_MULTIPROCESSING=0) against vLLM's own worker process (`mp`, what `grpo-exp serve` starts), alternating,
each server alone: `python -m benchmarks.serve_executor`.

For each: seconds until the server lists its model, then sampled requests of exactly 64 new tokens, 8 at once
(what a step of 2 prompts x G=4 sends) and 4 one after the other. Alone, `uni` was faster; under `make test`'s load
it was not (BENCHMARKS.md), so `mp` stays the default.

    python -m benchmarks.serve_executor [--model smollm2_135m] [--repeats 2]
"""

import argparse
import concurrent.futures
import os
import statistics
import sys
import time

import requests

from benchmarks.heldout_eval import cpu_name
from support.servers import free_port, started

NEW_TOKENS = 64
# (environment, vLLM options) of each; vLLM's CPU build turns `uni` into `mp` whenever V1 multiprocessing is on
EXECUTORS = {
    "uni": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ["--", "--distributed-executor-backend", "uni"]),
    "mp": ({}, []),
}


def served(port: int, process, timeout: float = 600) -> str:
    """The name of the model the server on `port` lists, once it answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"grpo-exp serve exited with {process.returncode}")
        try:
            return requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()["data"][0]["id"]
        except (requests.RequestException, ValueError, KeyError, IndexError):
            time.sleep(0.25)
    sys.exit(f"no answer on port {port} in {timeout} s")


def sample(port: int, name: str, seed: int) -> int:
    request = {"model": name, "prompt": f"Question {seed}: what is 2+{seed}?", "max_tokens": NEW_TOKENS}
    request |= {"min_tokens": NEW_TOKENS, "temperature": 1.0, "seed": seed}
    answer = requests.post(f"http://127.0.0.1:{port}/v1/completions", json=request, timeout=600).json()
    return answer["usage"]["completion_tokens"]


def measure(model: str, executor: str) -> dict[str, float]:
    port, start = free_port(), time.perf_counter()
    environment, options = EXECUTORS[executor]
    command = [sys.executable, "-m", "grpo_exp.serve", "--model", model, "--port", str(port), *options]
    with started(command, env={**os.environ, **environment}) as process:
        name = served(port, process)
        seconds = {"start": time.perf_counter() - start}
        for label, count, parallel in (("8 at once", 8, 8), ("4 in turn", 4, 1)):
            begin = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                tokens = sum(pool.map(lambda seed: sample(port, name, seed), range(count)))
            assert tokens == count * NEW_TOKENS, tokens
            seconds[label] = time.perf_counter() - begin
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_executor")
    parser.add_argument("--model", default="smollm2_135m", help="what `grpo-exp serve --model` takes")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"grpo-exp serve --model {args.model} on CPU, {cpu_name()}, {os.cpu_count()} cores")
    results: dict[str, list[dict]] = {name: [] for name in EXECUTORS}
    for repeat in range(args.repeats):
        for executor in EXECUTORS:
            seconds = measure(args.model, executor)
            results[executor].append(seconds)
            print(f"repeat {repeat + 1}, {executor}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    for key in results["uni"][0]:
        uni, mp = (statistics.median(r[key] for r in results[name]) for name in ("uni", "mp"))
        print(f"{key}: uni {uni:.1f} s, mp {mp:.1f} s, ratio {uni / mp:.2f}x (medians of {args.repeats})")


if __name__ == "__main__":
    main()
