"""grpo_exp at the seed's scale against bare TRL: `python -m benchmarks.scale` (docs/scale.md, BENCHMARKS.md).

A model of a real architecture's shape with random weights (model=shape), the seed's settings (G=8, completions up
to 512 or 1,024 tokens, 2 prompts a step, a few steps), a reward with spread on any text (length: every group
trains), run as grpo_exp with its defaults and as a bare TRL GRPOTrainer, each in a fresh process. For each run: peak
memory (the resident set; on a GPU torch's peak allocated and reserved bytes), seconds a step (TRL's step_time, the
first step left out), the phase in which the peak happens, and grpo_exp's pre-load estimate of its peak
(grpo_exp.run.memory_estimate). `--features` also runs grpo_exp with each memory-heavy feature of its own turned on
(or off) alone.

    python -m benchmarks.scale [--shape qwen2.5-0.5b] [--lengths 512 1024] [--steps 3] [--features | --arms ...]
        [overrides...]
    python -m benchmarks.scale --fits          # the estimated fit table, by shape and machine
    python -m benchmarks.scale --table OUT.json  # an earlier run's table, its estimates made again
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from benchmarks.arguments import existing_file

# The arms: name -> (variant, overrides on top of the seed's settings). The features: grpo_exp's memory-heavy ones,
# each on (or off) alone against its defaults.
ARMS = {
    "trl": ("trl", []),
    "grpo_exp": ("grpo_exp", []),
}
FEATURES = {
    "no-sampling-copy": ("grpo_exp", ["trainer.fast_generation=false"]),
    "bfloat16-copy": ("grpo_exp", ["generation=transformers_bf16"]),
    "float64-reference": ("grpo_exp", ["trainer.float64_reference_every=1"]),
    "mismatch-metrics": ("grpo_exp", ["trainer.mismatch_metrics=true"]),
    "no-shared-prompt": ("grpo_exp", ["trainer.shared_prompt_forward=false"]),
    "trls-lm-head-tile": ("grpo_exp", ["trainer.lm_head_tile_tokens=4096"]),
    "gradient-checkpointing": ("grpo_exp", ["+trainer.extra.gradient_checkpointing=true"]),
}

# Bare TRL in grpo_exp's settings, for its estimate: no sampling copy, TRL's rows, TRL's LM-head tile
AS_BARE_TRL = [
    "trainer.fast_generation=false",
    "trainer.shared_prompt_forward=false",
    "trainer.lm_head_tile_tokens=4096",
]

HEADER = "| run | completion tokens | peak GiB | peak in | s/step | estimate GiB |\n|---|---|---|---|---|---|"


def seed_settings(shape: str, length: int, prompts: int, generations: int) -> list[str]:
    return [
        "model=shape",
        f"model.shape={shape}",
        "reward=length",
        "reward.components.length.target_chars=1000000",  # never reached: the reward is the length, spread in a group
        f"trainer.prompts_per_step={prompts}",
        f"trainer.num_generations={generations}",
        f"trainer.max_completion_length={length}",
    ]


def run(variant: str, steps: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.scale_worker", variant, str(steps), str(out), *overrides]
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0 or not out.is_file():
            tail = completed.stderr[-3000:]
            return {"variant": variant, "overrides": overrides, "failed": tail.strip().splitlines()[-1:] or ["?"]}
        return json.loads(out.read_text())


def estimate(variant: str, overrides: list[str]) -> float | None:
    """grpo_exp's pre-load estimate of the run's peak (GiB), as the run itself computes it (bare TRL's: with
    grpo_exp's features off)."""
    from grpo_exp.run.memory_check import estimate_run
    from support.config import resolved_config

    return estimate_run(resolved_config(overrides + (AS_BARE_TRL if variant == "trl" else []))).total_gib


def seconds_per_step(result: dict) -> float | None:
    times = result.get("step_times") or []
    return statistics.median(times[1:] or times) if times else None


def peak_phase(result: dict) -> str:
    by_phase = result.get("cuda_allocated_gib_by_phase") or result.get("rss_gib_by_phase") or {}
    return max(by_phase, key=by_phase.get) if by_phase else "?"


def row(name: str, length: int, result: dict, estimated: float | None) -> str:
    if "failed" in result:
        failure = result["failed"][0]
        said = failure if failure.startswith("not run") else f"failed: {failure[:80]}"
        return f"| {name} | {length} | {said} | | | {'' if estimated is None else f'{estimated:.2f}'} |"
    peak = result["peak_rss_gib"]
    gpu = result.get("cuda_allocated_gib_by_phase") or {}
    if gpu:
        allocated, reserved = max(gpu.values()), max(result["cuda_reserved_gib_by_phase"].values())
        peak_text = f"{allocated:.2f} alloc / {reserved:.2f} res (RSS {peak:.2f})"
        measured = allocated
    else:
        peak_text, measured = f"{peak:.2f}", peak
    off = "" if estimated is None else f"{estimated:.2f} ({(estimated - measured) / measured:+.0%})"
    step = seconds_per_step(result)
    return f"| {name} | {length} | {peak_text} | {peak_phase(result)} | {step:.1f} | {off} |"


# Machines the fit table is made for: (name, GiB free for one training process, on a GPU)
MACHINES = (("this CPU (24 GiB, about 22 free)", 22.0, False), ("one H200 (139 GiB)", 139.0, True))
PROMPT_TOKENS = 200  # a GSM8K prompt in a chat template, about


def fits_table(shapes: list[str], prompts: int) -> list[str]:
    """For each shape and machine, the largest group size x completion length whose estimated peak fits, full
    fine-tuning (float32 master weights; bfloat16 compute on the GPU) with and without gradient checkpointing, and
    LoRA (r 16, frozen bfloat16 weights) with it: estimates, not measurements (docs/scale.md says which were run)."""
    from grpo_exp.model_shapes import parameter_count, shape_config
    from grpo_exp.run.memory_estimate import GIB, estimate, run_shape

    lines = [
        "| shape | machine | full, no checkpointing | full, checkpointing | LoRA + checkpointing |",
        "|---|---|---|---|---|",
    ]
    for shape in shapes:
        config = shape_config(shape)
        parameters = parameter_count(config)
        for machine, free_gib, on_gpu in MACHINES:
            cells = []
            for lora, checkpointing in ((False, False), (False, True), (True, True)):
                best = None
                for group in (16, 8, 4, 2):
                    for length in (1024, 512, 256, 128):
                        settings = {
                            "weight_bytes": 2 if lora else 4,
                            "compute_bytes": 2 if on_gpu or lora else 4,
                            "rows": prompts * group,
                            "tokens": PROMPT_TOKENS + length,
                            "prompt_tokens": PROMPT_TOKENS,
                            "packed_group": group,  # grpo_exp's shared-prompt forward, where a pack is short enough
                            "lora_r": 16 if lora else None,
                            "gradient_checkpointing": checkpointing,
                            "on_gpu": on_gpu,
                        }
                        peak = estimate(run_shape(config, parameters, settings)).total
                        if peak <= free_gib * GIB and (best is None or group * length > best[0] * best[1]):
                            best = (group, length, peak / GIB)
                cells.append("does not fit" if best is None else f"G={best[0]} x {best[1]} ({best[2]:.0f} GiB)")
            lines.append(f"| {shape} | {machine} | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--features", action="store_true", help="each memory-heavy feature alone, too")
    parser.add_argument("--arms", nargs="+", choices=[*ARMS, *FEATURES], help="only these arms (default: trl grpo_exp)")
    parser.add_argument("--out", type=Path, help="the results as JSON")
    parser.add_argument(
        "--table", type=existing_file, help="print the table of an earlier --out file (estimates made again) and stop"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (both variants)")
    parser.add_argument("--fits", action="store_true", help="print the estimated fit table for the shapes and stop")
    args = parser.parse_args(argv)
    if args.fits:
        print(f"{args.prompts} prompts a step, prompts of {PROMPT_TOKENS} tokens:")
        print("\n".join(fits_table(["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"], args.prompts)))
        return
    if args.table:
        print(HEADER)
        for result in json.loads(args.table.read_text()):
            print(row(result["arm"], result["length"], result, estimate(result["variant"], result["overrides"])))
        return
    arms = {name: (ARMS | FEATURES)[name] for name in args.arms} if args.arms else dict(ARMS)
    if args.features:
        arms |= FEATURES
    results = []
    print(
        f"{args.shape}, {args.prompts} prompts x G={args.generations}, {args.steps} steps, {' '.join(args.overrides)}"
    )
    print(HEADER)
    for length in args.lengths:
        settings = seed_settings(args.shape, length, args.prompts, args.generations) + args.overrides
        for name, (variant, extra) in arms.items():
            estimated = estimate(variant, settings + extra)
            free = psutil.virtual_memory().available / 2**30
            if estimated > free:  # the out-of-memory killer would end it, and maybe more than it
                reason = f"not run: estimated {estimated:.1f} GiB, {free:.1f} GiB available"
                result = {"variant": variant, "overrides": settings + extra, "failed": [reason]}
            else:
                result = run(variant, args.steps, settings + extra)
            results.append(result | {"arm": name, "length": length, "estimate_gib": estimated})
            print(row(name, length, result, estimated), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
