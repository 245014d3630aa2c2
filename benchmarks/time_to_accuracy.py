"""Time to accuracy: `python -m benchmarks.time_to_accuracy` (part of `make bench`).

The default experiment (`make train`: embedded SmolLM2, offline arithmetic, reward=math, 40 steps of 2 prompts x
G=4) under grpo_exp's settings (ARMS; `best` by default) against bare TRL: same model, data, seeds, group size,
completion length and learning rate. For each seed, one bare TRL run (GRPOTrainer straight, no logging) and one
run of each grpo_exp arm (the real `python -m grpo_exp.train` job, W&B offline logging and group statistics
on), each a fresh process, their order rotating by seed. Checkpoints are off in all. Measured: the training wall time
(trainer.train(); loading and evaluation excluded) and greedy held-out accuracy afterwards on the same 100
problems, by the same function (grpo_exp.run.heldout.heldout_accuracy).

Each run's result is appended to --results as it finishes, with the arm's settings and the overrides it ran with;
runs already there with the same arm, seed, settings and overrides are not run again, so an interrupted benchmark
continues where it stopped. A run whose arm has changed since (or that predates this record) is run again, and
only runs of the current settings are reported.

With --every N, the grpo_exp arms also validate every N steps (greedy, the same 100 problems), and each run records
its time to accuracy: the training time (the sum of TRL's step_time through that step: validating is not training)
and the step of its first validation at or above the target, the bare TRL run's final accuracy of the same seed.
`--baseline ARM` then reports every arm's time to that accuracy over the baseline arm's, seed by seed.

    python -m benchmarks.time_to_accuracy [--seeds 42 43 44] [--arms trl best] [--results JSON] [--out PNG]
                                          [--every N --baseline ARM] [--paired ARM] [overrides of every arm...]

`--paired ARM` sets each arm against ARM on the same held-out problems (generation ahead against synchronous:
`--arms vllm_server async1 async2 --paired vllm_server`, each served run against its own fresh `grpo-exp serve`).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.fresh_process import run_command

# Each arm: bare TRL (None) or grpo_exp with these settings, each lever named whatever the defaults are (arms measured
# before trainer.fast_generation existed say fast_generation=false: it is on by default on x86-64 CPUs now).
# `skip_shared`: skip + the shared-prompt loss forward. `best`: the fastest on-policy settings measured here (with
# generation=transformers_fast). `skip_shared_bf16`: bfloat16 sampling instead, which ended lower on held-out
# accuracy (BENCHMARKS.md).
ARMS = {
    "trl": None,
    "keep": [
        "trainer.zero_variance_groups=keep",
        "trainer.shared_prompt_forward=false",
        "generation=transformers",
        "trainer.fast_generation=false",
    ],
    "skip": [
        "trainer.zero_variance_groups=skip",
        "trainer.shared_prompt_forward=false",
        "generation=transformers",
        "trainer.fast_generation=false",
    ],
    "shared": [
        "trainer.zero_variance_groups=keep",
        "trainer.shared_prompt_forward=true",
        "generation=transformers",
        "trainer.fast_generation=false",
    ],
    "bf16": [
        "trainer.zero_variance_groups=keep",
        "trainer.shared_prompt_forward=false",
        "generation=transformers_bf16",
        "trainer.fast_generation=false",
    ],
    "resample": [
        "trainer.zero_variance_groups=resample",
        "trainer.shared_prompt_forward=false",
        "generation=transformers",
        "trainer.fast_generation=false",
    ],
    "skip_shared": [
        "trainer.zero_variance_groups=skip",
        "trainer.shared_prompt_forward=true",
        "generation=transformers",
        "trainer.fast_generation=false",
    ],
    "fast": [
        "trainer.zero_variance_groups=keep",
        "trainer.shared_prompt_forward=false",
        "generation=transformers_fast",
    ],
    "skip_shared_bf16": [
        "trainer.zero_variance_groups=skip",
        "trainer.shared_prompt_forward=true",
        "generation=transformers_bf16",
        "trainer.fast_generation=false",
    ],
    "best": ["trainer.zero_variance_groups=skip", "trainer.shared_prompt_forward=true", "generation=transformers_fast"],
    # today's defaults, and the same with the curriculum over prompts' difficulty (curriculum.*, its defaults)
    "defaults": [],
    "curriculum": ["curriculum.enabled=true"],
    # a warm-up on the policy's own right answers to 200 training prompts (4 samples each), then GRPO (issue 66)
    "warmup_rft": ["warmup=sft", "warmup.prompts=200"],
    # vLLM's engine in this process (its CPU build): the policy's float32, and bfloat16 with TRL's correction
    "vllm": ["generation=vllm_colocate"],
    "vllm_bf16": ["generation=vllm_colocate", "trainer.bfloat16_generation=true"],
    # a vLLM server started beforehand (grpo-exp serve; its port among the overrides: trainer.extra.vllm_server_port=
    # N): synchronous, and generating 1 and 2 steps ahead (docs/async.md)
    "vllm_server": ["generation=vllm_server"],
    # the synchronous run again, seed for seed: how far two runs of one seed end apart is the noise an arm's difference
    # from `vllm_server` must stand out of. With trainer.seeded_sampling=true each prompt's draws are its
    # own, and the two should be one run; with trainer.seeded_sampling=false (vLLM's one generator, whose draws depend
    # on how its scheduler batched the requests) two runs of a seed parted after their first steps
    "vllm_server_again": ["generation=vllm_server"],
    # the synchronous run against a server whose sampler draws its exponential noise in float64 (vLLM's
    # --use-fp64-gumbel, SERVER_ARGS): the float32 noise of its default sampler never draws the vocabulary's least
    # likely tokens (BENCHMARKS.md, vLLM's sampling law)
    "vllm_server_fp64": ["generation=vllm_server"],
    "async1": ["generation=vllm_async"],
    "async2": ["generation=vllm_async", "trainer.max_staleness=2"],
    # staleness 1 under the token-level corrections in place of TRL's default (sequence_mask): where the gap to
    # synchronous may come from (docs/async.md)
    "async1_token_truncate": ["generation=vllm_async", "trainer.mismatch_correction=token_truncate"],
    "async1_token_mask": ["generation=vllm_async", "trainer.mismatch_correction=token_mask"],
}
COMMON = ["trainer.save_steps=0", "save_model=false"]
# The arms whose generation is a vLLM server: each run gets a freshly started one (grpo-exp serve), so that every run
# starts from the same server state (with trainer.seeded_sampling=false, its sampler's)
SERVER_GENERATION = {"generation=vllm_server", "generation=vllm_async"}
SERVED = tuple(arm for arm, settings in ARMS.items() if SERVER_GENERATION & set(settings or []))
SERVER_ARGS = {"vllm_server_fp64": ("--use-fp64-gumbel",)}  # vLLM's own options for an arm's server


def run_trl(seed: int, overrides: list[str]) -> dict:
    """Bare TRL: train, then the held-out accuracy of the trained policy (in this process)."""
    from benchmarks.overhead_worker import bare_trl_trainer
    from grpo_exp.data import load_splits
    from grpo_exp.run.heldout import heldout_accuracy
    from grpo_exp.verification.labels import build_labels
    from support.config import resolved_config

    overrides = [f"trainer.seed={seed}", *overrides]
    steps = resolved_config(overrides).cfg.trainer.max_steps
    with tempfile.TemporaryDirectory() as tmp:
        trainer, spec = bare_trl_trainer(steps, Path(tmp), overrides)
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
        steps = step_records(trainer.state.log_history)
    _, heldout = load_splits(spec.cfg.dataset)
    result = heldout_accuracy(
        trainer.model,
        trainer.processing_class,
        heldout,
        build_labels(spec.cfg.verifier, load_splits(spec.cfg.dataset)[0]["solution"]),
        spec.eval_max_new_tokens,
        spec.cfg.eval.batch_size,
        None,
    )
    return {"train_seconds": seconds, "accuracy_after": result.accuracy, "steps": steps}


def run_grpo_exp(
    seed: int, settings: list[str], overrides: list[str], every: int = 0, served: tuple[str, ...] | None = None
) -> dict:
    """The grpo_exp job (against a vLLM server started for it with vLLM's options `served`, where given): its
    training time, held-out accuracy before and after, and each held-out problem's verdict after (1, 0, None:
    undecided) for paired comparisons."""
    if served is not None:
        from support.servers import free_port, vllm_server

        port = free_port()
        with vllm_server(port, vllm_args=served):
            return run_grpo_exp(seed, [*settings, f"trainer.extra.vllm_server_port={port}"], overrides, every)
    from grpo_exp.run_files import eval_file

    validation = [f"eval.every={every}"] if every else []
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "grpo_exp.train",
            f"trainer.seed={seed}",
            f"hydra.run.dir={tmp}/run",
            *COMMON,
            *overrides,
            *settings,
            *validation,
        ]
        completed = run_command(command)
        if completed.returncode != 0:
            raise SystemExit(f"grpo_exp run (seed {seed}) failed:\n{completed.stderr[-3000:]}")
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
        metrics = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        answers = (Path(tmp) / "run" / eval_file("after")).read_text().splitlines()
    warmed = summary.get("warmup_seconds") or 0.0  # a warm-up's time counts as training (warmup=sft)
    result = {
        "train_seconds": summary["train_seconds"] + warmed,
        "accuracy_before": summary.get("heldout_accuracy_before_warmup", summary["heldout_accuracy_before"]),
        "accuracy_after": summary["heldout_accuracy_after"],
        "correct_after": [None if (c := json.loads(line)["correct"]) is None else int(c) for line in answers],
        "steps": step_records(metrics),
    }
    return result | ({"every": every, "validations": validations(metrics, warmed)} if every else {})


def step_records(metrics: list[dict]) -> list[list[float]]:
    """[step, its seconds, its share of groups without a reward spread] of each logged training step: where a run's
    time went step by step (with grpo_exp's default `skip`, a step whose groups all tie has no loss to compute)."""
    from grpo_exp.run_files import step_seconds

    return [
        [record["step"], step_seconds(record), record.get("frac_reward_zero_std")]
        for record in metrics
        if step_seconds(record) is not None
    ]


def validations(metrics: list[dict], start: float = 0.0) -> list[list[float]]:
    """[step, training seconds through that step, held-out accuracy] of each validation in a run's metrics.jsonl;
    `start`: seconds trained before its first step (a warm-up's)."""
    from grpo_exp.run_files import step_seconds  # a step's time with generation ahead's sync (TRL's step_time lacks it)

    seconds, elapsed, points = start, {}, []
    for record in sorted(metrics, key=lambda m: m["step"]):
        seconds += step_seconds(record) or 0.0
        elapsed[record["step"]] = seconds
        if "heldout/accuracy" in record:
            points.append([record["step"], elapsed[record["step"]], record["heldout/accuracy"]])
    return points


def time_to(target: float, points: list[list[float]]) -> tuple[int, float] | None:
    """The step and training seconds of the first validation at or above `target` (None: never reached)."""
    return next(((int(step), seconds) for step, seconds, accuracy in points if accuracy >= target - 1e-9), None)


def run_arm(arm: str, seed: int, overrides: list[str], every: int = 0) -> dict:
    if ARMS[arm] is not None:
        served = SERVER_ARGS.get(arm, ()) if arm in SERVED else None
        return run_grpo_exp(seed, ARMS[arm], overrides, every, served)
    with tempfile.TemporaryDirectory() as tmp:  # bare TRL in its own process, as the grpo_exp job is
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.time_to_accuracy", "--trl-worker", str(seed), str(out), *overrides]
        completed = run_command(command)
        if completed.returncode != 0:
            raise SystemExit(f"bare TRL run (seed {seed}) failed:\n{completed.stderr[-3000:]}")
        return json.loads(out.read_text())


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {sd:.3f}"


def report(results: list[dict], arms: list[str]) -> None:
    by = {(r["arm"], r["seed"]): r for r in results}
    for arm in [a for a in arms if a != "trl"]:
        seeds = sorted(seed for name, seed in by if name == arm and ("trl", seed) in by)
        if not seeds:
            continue
        trl, ours = [by["trl", s] for s in seeds], [by[arm, s] for s in seeds]
        ratios = [o["train_seconds"] / t["train_seconds"] for o, t in zip(ours, trl, strict=True)]
        print(f"{arm} ({' '.join(ARMS[arm]) or 'the defaults'}) against bare TRL, seeds {seeds}:")
        for label, runs in (("bare TRL", trl), (arm, ours)):
            print(
                f"  {label:9s} held-out after {mean_sd([r['accuracy_after'] for r in runs])}, "
                f"training {mean_sd([r['train_seconds'] / 60 for r in runs])} min"
            )
        mean_ours = statistics.mean(r["accuracy_after"] for r in ours)
        reached = mean_ours >= statistics.mean(r["accuracy_after"] for r in trl)
        print(f"  wall time {arm} / bare TRL: {mean_sd(ratios)} (per seed: {', '.join(f'{r:.3f}' for r in ratios)})")
        print(
            f"  reached bare TRL's final accuracy (mean over seeds): {'yes' if reached else 'no'}, in "
            f"{statistics.mean(ratios):.2f}x its wall time (target <= 0.5x)"
        )


def report_time_to(results: list[dict], arms: list[str], baseline: str) -> None:
    """Each arm's time to the bare TRL run's final accuracy (same seed) over the baseline arm's, seed by seed."""
    from grpo_exp.measures import mean_interval

    by = {(r["arm"], r["seed"]): r for r in results}
    for arm in [a for a in arms if a not in ("trl", baseline)]:
        seeds = sorted(s for name, s in by if name == arm and ("trl", s) in by and (baseline, s) in by)
        if not seeds:
            continue
        every = by[arm, seeds[0]]["every"]
        print(f"time to bare TRL's 40-step accuracy, {arm} / {baseline} (validation every {every} steps):")
        ratios = []
        for seed in seeds:
            target = by["trl", seed]["accuracy_after"]
            ours, base = (time_to(target, by[name, seed]["validations"]) for name in (arm, baseline))
            line = f"  seed {seed}: target {target:.3f}; {baseline} {_reached(base)}; {arm} {_reached(ours)}"
            if ours and base:
                ratios.append(ours[1] / base[1])
                line += f"; ratio {ratios[-1]:.3f}"
            print(line)
        if len(ratios) > 1:
            mean, low, high = mean_interval(ratios)
            print(f"  {arm} / {baseline}: {mean:.3f}, 95% t-interval [{low:.3f}, {high:.3f}] over {len(ratios)} seeds")


def report_paired(results: list[dict], arms: list[str], baseline: str) -> None:
    """Each arm against the baseline arm on the same held-out problems, seed by seed: the per-seed accuracies and
    their differences; the mean difference with its 95% t interval over seeds (each seed's training is the unit
    that varies); and over every (seed, problem) pair, the paired t interval and the exact sign test on the pairs
    where the two runs disagree."""
    from grpo_exp.measures import exact_sign_test, mean_interval, paired_change

    by = {(r["arm"], r["seed"]): r for r in results}
    for arm in [a for a in arms if a != baseline]:
        seeds = sorted(s for name, s in by if name == arm and (baseline, s) in by and "correct_after" in by[name, s])
        seeds = [s for s in seeds if "correct_after" in by[baseline, s]]
        if not seeds:
            continue
        print(f"{arm} ({' '.join(ARMS[arm] or ['bare TRL'])}) against {baseline}, paired on the held-out problems:")
        per_seed, before, after = [], [], []
        for seed in seeds:
            ours, base = by[arm, seed], by[baseline, seed]
            per_seed.append(ours["accuracy_after"] - base["accuracy_after"])
            verdicts = zip(base["correct_after"], ours["correct_after"], strict=True)
            pairs = [(b, o) for b, o in verdicts if None not in (b, o)]
            before += [b for b, _ in pairs]
            after += [o for _, o in pairs]
            print(
                f"  seed {seed}: {baseline} {base['accuracy_after']:.2f}, {arm} {ours['accuracy_after']:.2f}, "
                f"difference {per_seed[-1]:+.2f}"
            )
        mean, low, high = mean_interval(per_seed)
        print(f"  over {len(seeds)} seeds: mean difference {mean:+.3f}, 95% t interval [{low:+.3f}, {high:+.3f}]")
        mean, low, high = paired_change(before, after)
        better, worse, p = exact_sign_test([a - b for b, a in zip(before, after, strict=True)])
        print(
            f"  over {len(before)} (seed, problem) pairs: {mean:+.3f}, 95% t interval [{low:+.3f}, {high:+.3f}]; "
            f"{better} better, {worse} worse: exact sign test p = {p:.3g}"
        )


def report_against_repeat(results: list[dict], arms: list[str], baseline: str, repeat: str) -> None:
    """Each arm against the baseline's two runs of each seed (the baseline and its repeat): the run is the unit."""
    from grpo_exp.measures import against_repeated_baseline

    accuracy = {arm: {r["seed"]: r["accuracy_after"] for r in results if r["arm"] == arm} for arm in arms}
    for arm in [a for a in arms if a not in (baseline, repeat)]:
        seeds = sorted(set(accuracy[baseline]) & set(accuracy[repeat]) & set(accuracy[arm]))
        if not seeds:
            continue
        (mean, low, high), (noise, noise_low, noise_high) = against_repeated_baseline(
            accuracy[baseline], accuracy[repeat], accuracy[arm]
        )
        print(
            f"{arm} against the mean of {baseline} and {repeat} (two runs of each seed), seeds {seeds}: "
            f"{mean:+.3f}, 95% t interval [{low:+.3f}, {high:+.3f}]; {repeat} - {baseline} (two runs of one "
            f"setting): {noise:+.3f} [{noise_low:+.3f}, {noise_high:+.3f}]"
        )


def _reached(point: tuple[int, float] | None) -> str:
    return "not reached" if point is None else f"step {point[0]}, {point[1] / 60:.2f} min"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = next((r["accuracy_before"] for r in results if "accuracy_before" in r), None)
    fig, ax = plt.subplots(figsize=(6, 4))
    for number, arm in enumerate(dict.fromkeys(r["arm"] for r in results)):
        runs = [r for r in results if r["arm"] == arm]
        label = "bare TRL" if arm == "trl" else f"grpo_exp {arm}"
        for i, r in enumerate(runs):
            # with --every: the validations, at the training time (steps only) they were made; else start and end
            points = r.get("validations") or [[0, 0.0, before], [None, r["train_seconds"], r["accuracy_after"]]]
            ax.plot(
                [seconds / 60 for _, seconds, _ in points],
                [accuracy for _, _, accuracy in points],
                color=f"C{number}",
                alpha=0.6,
                marker="o",
                label=label if i == 0 else None,
            )
    ax.set_xlabel("training time (min), 2 CPU cores (with validations: the steps' own time)")
    ax.set_ylabel("held-out accuracy (greedy, 100 problems)")
    ax.set_title("time to accuracy: each seed over 40 steps")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"figure: {path}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--trl-worker"]:
        seed, out, *overrides = argv[1:]
        Path(out).write_text(json.dumps(run_trl(int(seed), overrides)))
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.time_to_accuracy")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["trl", "best"])
    parser.add_argument("--results", type=Path, default=Path("outputs/time_to_accuracy/results.json"))
    parser.add_argument("--out", type=Path, default=Path("outputs/time_to_accuracy/time_to_accuracy.png"))
    parser.add_argument("--every", type=int, default=0, help="grpo_exp arms validate every N steps: time to accuracy")
    parser.add_argument("--baseline", choices=list(ARMS), help="with --every: report time to accuracy over this arm")
    parser.add_argument("--paired", choices=list(ARMS), help="report each arm against this one, problem by problem")
    parser.add_argument(
        "--repeat", choices=list(ARMS), help="with --paired: this arm repeats that one; each arm against both, by run"
    )
    parser.add_argument("overrides", nargs="*", help="the experiment, for both (default: `make train`'s)")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text()) if args.results.exists() else []
    if args.baseline and not args.every:
        parser.error("--baseline compares times to accuracy: give --every N too")
    if args.repeat and not args.paired:
        parser.error(f"--repeat {args.repeat}: give --paired ARM too, the arm it repeats")
    kept = current(results, args.overrides, args.every)
    if results:
        stale = len(results) - len(kept)
        print(
            f"continuing {args.results}: {len(kept)} runs of the current settings are kept"
            + (f", {stale} of other settings are ignored" if stale else "")
            + " (delete it to measure them again)"
        )
    for index, seed in enumerate(args.seeds):
        rotation = index % len(args.arms)
        for arm in args.arms[rotation:] + args.arms[:rotation]:
            if any(r["arm"] == arm and r["seed"] == seed for r in kept):
                continue
            run = {"arm": arm, "seed": seed, "settings": ARMS[arm], "overrides": args.overrides}
            result = run | run_arm(arm, seed, args.overrides, args.every)
            results.append(result)
            kept.append(result)
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(results, indent=1))
            print(
                f"  seed {seed} {arm:8s}: {result['train_seconds'] / 60:5.2f} min training, "
                f"held-out after {result['accuracy_after']:.3f}",
                flush=True,
            )
    report(kept, args.arms)
    if args.paired:
        report_paired(kept, args.arms, args.paired)
    if args.repeat:
        report_against_repeat(kept, args.arms, args.paired, args.repeat)
    if args.baseline:
        report_time_to(kept, args.arms, args.baseline)
    plot(kept, args.out)


def current(results: list[dict], overrides: list[str], every: int = 0) -> list[dict]:
    """The runs made with their arm's present settings, these overrides and (grpo_exp's) this validation schedule
    (a run without that record: not)."""
    return [
        r
        for r in results
        if "settings" in r
        and r["settings"] == ARMS.get(r["arm"], "gone")
        and r.get("overrides") == overrides
        and (r["settings"] is None or r.get("every", 0) == every)
    ]


if __name__ == "__main__":
    main()
