"""Held-out evaluation speed: `python -m benchmarks.heldout_eval` (part of `make bench`).

The default experiment's greedy held-out evaluation (the embedded SmolLM2-135M, the 100 held-out problems, batches
of eval.batch_size), two ways, one after the other in one process and alternating over repeats: generate() on the
float32 policy (eval.prepacked=false, the path before issue 26) and the policy's oneDNN-prepacked float32 copy
(eval.prepacked=true, the default). Prints each path's seconds (median of the repeats), the ratio, and how many
problems the two answer differently (the claim: none). With --samples K, then K sampled answers a problem at
eval.temperature both ways (pass@k, and the policy's own answers that self-verification judges, since issue 67): the
seconds, the ratio and each way's pass@1 (the draws differ; the distributions should not).

    python -m benchmarks.heldout_eval [--repeats 2] [--problems 100] [--samples 0]
"""

import argparse
import platform
import statistics
import time

import torch

from grpo_exp.data import load_splits
from grpo_exp.run.heldout import heldout_accuracy, sampled_metrics
from grpo_exp.run.setup import load_policy
from grpo_exp.verification.labels import build_labels
from support.config import resolved_config


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        avx512 = " avx512f" in f.read()
    return f"{name}, {'with' if avx512 else 'without'} AVX-512"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heldout_eval")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--samples", type=int, default=0, help="also time K sampled answers a problem (0: not)")
    args = parser.parse_args(argv)
    spec = resolved_config([])
    cfg = spec.cfg
    train, heldout = load_splits(cfg.dataset)
    heldout = heldout.select(range(min(args.problems, len(heldout))))
    tokenizer, model = load_policy(spec, spec.policy_dtype)
    verifier = build_labels(cfg.verifier, train["solution"])
    print(
        f"held-out evaluation, embedded SmolLM2-135M, {len(heldout)} problems, batches of {cfg.eval.batch_size}, "
        f"{spec.eval_max_new_tokens} new tokens at most, {torch.get_num_threads()} threads, {cpu_name()}",
        flush=True,
    )
    seconds: dict[bool, list[float]] = {False: [], True: []}
    answers: dict[bool, list[str]] = {}
    for _ in range(args.repeats):
        for prepacked in (False, True):
            started = time.perf_counter()
            result = heldout_accuracy(
                model,
                tokenizer,
                heldout,
                verifier,
                spec.eval_max_new_tokens,
                cfg.eval.batch_size,
                None,
                prepacked=prepacked,
            )
            seconds[prepacked].append(time.perf_counter() - started)
            answers[prepacked] = [sample["completion"] for sample in result.samples]
            print(f"  prepacked={prepacked!s:5}: {seconds[prepacked][-1]:6.1f} s, accuracy {result.accuracy:.3f}")
    today, fast = statistics.median(seconds[False]), statistics.median(seconds[True])
    differing = sum(a != b for a, b in zip(answers[False], answers[True], strict=True))
    print(
        f"generate() on the policy {today:.1f} s, prepacked copy {fast:.1f} s: {today / fast:.2f}x faster; "
        f"{differing} of {len(heldout)} problems answered differently"
    )
    if args.samples:
        time_sampled(spec, model, tokenizer, heldout, verifier, args.samples, args.repeats)


def time_sampled(spec, model, tokenizer, heldout, verifier, samples: int, repeats: int) -> None:
    """K sampled answers a problem, generate() on the policy against the prepacked copy, alternating."""
    cfg = spec.cfg
    seconds: dict[bool, list[float]] = {False: [], True: []}
    pass_at_1: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(repeats):
        for prepacked in (False, True):
            torch.manual_seed(repeat)
            started = time.perf_counter()
            result = sampled_metrics(
                model, tokenizer, heldout, verifier, samples, cfg.eval.temperature, spec.eval_max_new_tokens,
                cfg.eval.batch_size, prepacked=prepacked,
            )  # fmt: skip
            seconds[prepacked].append(time.perf_counter() - started)
            pass_at_1[prepacked].append(result.metrics["pass@1"])
            took, drawn = seconds[prepacked][-1], pass_at_1[prepacked][-1]
            print(f"  sampled, prepacked={prepacked!s:5}: {took:6.1f} s, pass@1 {drawn:.3f}")
    today, fast = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(
        f"{samples} sampled answers a problem at temperature {cfg.eval.temperature}: generate() on the policy "
        f"{today:.1f} s, prepacked copy {fast:.1f} s: {today / fast:.2f}x faster; pass@1 "
        f"{statistics.mean(pass_at_1[False]):.3f} against {statistics.mean(pass_at_1[True]):.3f}"
    )


if __name__ == "__main__":
    main()
