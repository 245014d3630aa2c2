"""The sampler/trainer mismatch on the default run, path by path, with and without a correction (issue: trust the
learning signal).

Each arm is `python -m grpo_exp.train logger=none` with its overrides, the mismatch measured and the float64
reference every 10 steps, a fresh process, one after the other. Reported per run: the held-out accuracy before and
after (100 problems, greedy), the mean over steps of the mismatch metrics, and the seconds per training step.

    python -m benchmarks.mismatch_paths --seeds 42 --results outputs/mismatch_paths.json
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ARMS = {
    "float32_copy": [],  # the default on an x86-64 CPU: the prepacked float32 copy samples
    "generate": ["trainer.fast_generation=false"],  # TRL's generate() on the policy
    "bf16_behaviour_ratio": ["generation=transformers_bf16"],  # the bfloat16 copy's default correction
    "bf16_none": ["generation=transformers_bf16", "trainer.mismatch_correction=none"],
    "bf16_token_truncate": ["generation=transformers_bf16", "trainer.mismatch_correction=token_truncate"],
}
METRICS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/mismatch_kl",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/max",
    "sampling/float64/sampler_logp_difference/mean",
    "sampling/float64/trainer_logp_difference/mean",
)


def run_arm(arm: str, seed: int, out: Path) -> dict:
    run_dir = out / f"{arm}-seed{seed}"
    command = [
        sys.executable,
        "-m",
        "grpo_exp.train",
        "logger=none",
        f"trainer.seed={seed}",
        "trainer.mismatch_metrics=true",  # measured on every arm (auto measures the bfloat16 copy only)
        "trainer.float64_reference_every=10",
        *ARMS[arm],
        f"hydra.run.dir={run_dir}",
    ]
    print(" ".join(command[2:]), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    means = {key: statistics.fmean(s[key] for s in steps if key in s) for key in METRICS}
    return {
        "arm": arm,
        "seed": seed,
        "overrides": ARMS[arm],
        "heldout_before": summary["heldout_accuracy_before"],
        "heldout_after": summary["heldout_accuracy_after"],
        "seconds_per_step": summary["seconds_per_step"],
        **means,
    }


def table(results: list[dict]) -> str:
    header = "| arm | seed | held-out before -> after | mean abs logp diff | max | KL (k3) | ratio min..max |"
    header += " float64: sampler / trainer | s/step |"
    lines = [header, "|" + "---|" * 9]
    for r in results:
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['heldout_before']:.3f} -> {r['heldout_after']:.3f} "
            f"| {r[METRICS[0]]:.2e} | {r[METRICS[1]]:.2e} | {r[METRICS[2]]:.2e} "
            f"| {r[METRICS[3]]:.3f}..{r[METRICS[4]]:.3f} | {r[METRICS[5]]:.2e} / {r[METRICS[6]]:.2e} "
            f"| {r['seconds_per_step']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--results", type=Path, default=Path("outputs/mismatch_paths.json"))
    args = parser.parse_args()
    out = args.results.parent / "mismatch_paths"
    results = []
    for seed in args.seeds:
        for arm in args.arms:
            results.append(run_arm(arm, seed, out))
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(results, indent=2))  # nothing lost if a later arm fails
            print(table(results[-1:]).splitlines()[-1], flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
