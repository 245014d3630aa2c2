"""Multi-turn speed: `python -m benchmarks.multiturn_speed` (part of `make bench`).

Each turn prefilled whole (rollout.cache_turns=false, the loop before issue 45) against the KV cache kept across
turns (rollout.cache_turns=true, the default), and the cache kept with the turns sampled from the policy's prepacked
float32 copy (trainer.fast_generation / eval.prepacked, where this CPU prepacks): side by side in one process,
alternating over repeats, on the embedded SmolLM2-135M (float32, as a run trains it) with two presets:

- `+experiment=calculator`: 3 turns of up to 48 tokens, the calculator;
- `+experiment=textarena_guess`: TextArena's GuessTheNumber, 6 turns of up to 24 tokens after a long demonstration.

Two measurements each:
- a training step's rollout: prompts_per_step x G trajectories sampled at the trainer's temperature, with the
  sampler's log-probabilities (what TRL's rollout_func asks for); the same seed on both paths;
- the held-out episodes: greedy, in batches of eval.batch_size, on --problems held-out problems.

Prints the seconds (median of the repeats), the ratio, and how many trajectories the two paths played differently
(the claim: none, greedy; sampled, the same draws unless float rounding moves one).

With --steps N (0: skipped), also whole training steps through the command line, each preset N steps twice, in
fresh processes: the loop before (rollout.cache_turns=false trainer.fast_generation=false) against the defaults,
the median of TRL's step_time over the steps after the first; and the default single-turn run's, the yardstick.
--repeats 0 skips the rollouts.

    python -m benchmarks.multiturn_speed [--repeats 2] [--problems 16] [--steps 4] [--presets calculator ...]
"""

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.heldout_eval import cpu_name
from grpo_exp.data import load_splits
from grpo_exp.generation import prompt_ids
from grpo_exp.rollout.multiturn import MultiTurnRollout, greedy_generation
from grpo_exp.run.setup import load_policy
from grpo_exp.trainer.prepacked_linear import can_prepack
from grpo_exp.trainer.sampling_copy import SamplingCopy
from support.config import resolved_config

VARIANTS = ("whole", "cached", "cached+prepacked")


def timed_run(rollout: MultiTurnRollout, player, seed: int, *args, **kwargs) -> tuple[float, list]:
    torch.manual_seed(seed)
    started = time.perf_counter()
    trajectories = rollout.run(player, *args, **kwargs)
    return time.perf_counter() - started, [t.completion_ids for t in trajectories]


def measure(preset: str, repeats: int, problems: int) -> list[str]:
    spec = resolved_config([f"+experiment={preset}"])
    cfg = spec.cfg
    train, heldout = load_splits(cfg.dataset)
    tokenizer, model = load_policy(spec, spec.policy_dtype)
    model = model.to("cuda" if torch.cuda.is_available() else "cpu")
    rollouts = {}
    for cached in (False, True):
        settings = copy.deepcopy(cfg.rollout)
        OmegaConf.set_readonly(settings, False)
        settings.cache_turns = cached
        rollouts[cached] = MultiTurnRollout(settings)
    probe = prompt_ids(tokenizer, train[0]["prompt"])
    on_cpu = model.device.type == "cpu"  # the prepacked copy is a CPU kernel
    prepacked = SamplingCopy(model, torch.float32, prepack=True, probe=probe).copy if on_cpu and can_prepack() else None
    variants = {  # name: (rollout, the model that plays)
        "whole": (rollouts[False], model),
        "cached": (rollouts[True], model),
        **({"cached+prepacked": (rollouts[True], prepacked)} if prepacked is not None else {}),
    }
    group = cfg.trainer.num_generations
    step_rows = [row for row in train.select(range(cfg.trainer.prompts_per_step)) for _ in range(group)]
    eval_rows = list(heldout.select(range(min(problems, len(heldout)))))
    sampling = {
        "do_sample": True,
        "temperature": cfg.trainer.temperature,
        "top_p": None,
        "top_k": None,
        "pad_token_id": tokenizer.pad_token_id,
    }
    jobs = {
        f"a training step's rollout ({len(step_rows)} trajectories, sampled)": (
            [tokenizer, [r["prompt"] for r in step_rows], sampling, len(step_rows)],
            {"log_probs_at": cfg.trainer.temperature, "rows": step_rows},
        ),
        f"held-out episodes ({len(eval_rows)} problems, greedy, batches of {cfg.eval.batch_size})": (
            [tokenizer, [r["prompt"] for r in eval_rows], greedy_generation(tokenizer), cfg.eval.batch_size],
            {"rows": eval_rows},
        ),
    }
    lines = []
    for name, (args, kwargs) in jobs.items():
        seconds: dict[str, list[float]] = {variant: [] for variant in variants}
        played: dict[str, list] = {}
        for _ in range(repeats):
            for variant, (rollout, player) in variants.items():
                elapsed, played[variant] = timed_run(rollout, player, cfg.trainer.seed, *args, **kwargs)
                seconds[variant].append(elapsed)
        median = {variant: statistics.median(times) for variant, times in seconds.items()}
        cells = [f"{median[v]:.1f}" if v in median else "n/a" for v in VARIANTS]
        cells += [f"{median[v] / median['whole']:.2f}x" if v in median else "n/a" for v in VARIANTS[1:]]
        differ = [str(sum(a != b for a, b in zip(played["whole"], played[v], strict=True))) for v in played]
        tokens = sum(len(ids) for ids in played["whole"])
        trajectories = len(played["whole"])
        lines.append(
            f"| {preset} | {name} | {' | '.join(cells)} | {'; '.join(differ[1:])} of {trajectories} | {tokens} |"
        )
        print(lines[-1], flush=True)
    return lines


def training_seconds_per_step(preset: str | None, steps: int, overrides: list[str]) -> float:
    """`python -m grpo_exp.train +experiment=<preset>` (None: the default single-turn run) for `steps` steps, without
    evaluations: the median of TRL's step_time over the steps after the first (which also makes the sampling copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "grpo_exp.train", *([f"+experiment={preset}"] if preset else []),
            f"trainer.max_steps={steps}", "eval.before=false", "eval.after=false", "logger=none",
            "probe.labels_check=off", f"hydra.run.dir={tmp}", *overrides,
        ]  # fmt: skip
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0:
            raise SystemExit(f"{preset} {overrides} failed:\n{completed.stderr[-3000:]}")
        lines = (Path(tmp) / "metrics.jsonl").read_text().splitlines()
        times = [record["step_time"] for record in map(json.loads, lines) if "step_time" in record]
        return statistics.median(times[1:])


BEFORE = ["rollout.cache_turns=false", "trainer.fast_generation=false"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multiturn_speed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--presets", nargs="+", default=["calculator", "textarena_guess"])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else f"{torch.get_num_threads()} threads"
    print(f"multi-turn rollouts, embedded SmolLM2-135M float32, {where}, {cpu_name()}")
    print(
        "| preset | what | whole prefill each turn (s) | cache kept (s) | cache kept, prepacked copy (s) "
        "| cached / whole | cached+prepacked / whole | played differently (cached; cached+prepacked) | tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for preset in args.presets if args.repeats else ():
        measure(preset, args.repeats, args.problems)
    if args.steps:
        single = training_seconds_per_step(None, args.steps, [])
        print(f"\ntraining, {args.steps} steps; the default single-turn run: {single:.1f} s/step")
        print(
            "| preset | before (s/step) | defaults (s/step) | ratio | before / single-turn | defaults / single-turn |"
        )
        print("|---|---|---|---|---|---|")
        for preset in args.presets:
            before = training_seconds_per_step(preset, args.steps, BEFORE)
            now = training_seconds_per_step(preset, args.steps, [])
            print(
                f"| {preset} | {before:.1f} | {now:.1f} | {now / before:.2f}x | {before / single:.1f}x "
                f"| {now / single:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
