"""Generation ahead (generation=vllm_async) against synchronous generation from the same vLLM server, side by side in
one run: `python -m benchmarks.async_generation`.

Whole training steps of the default task (fresh processes, no evaluation, every group trained: with groups left
out, a step's work depends on how many had a spread, which differs between arms), timed by the wall clock:
transformers' train_runtime over the steps (TRL's step_time leaves out where the step's batch is drawn, where the
pipeline syncs the weights), on two placements of this machine's cores:
- shared: the server and the trainer each on every core (what a user gets without pinning);
- a core each: the server pinned to the last core (taskset, vLLM's OpenAI threads bound there), the trainer to the
  others with as many torch threads.
Arms: TRL's synchronous vllm_server; the pipeline with max_staleness 0 (synchronous: its wait is the generation's
share of a step, its sync the weight transfer's); max_staleness 1 and 2. From the synchronous arm's shares, the
speed-up to expect where generation has its own device: step / max(generation, training + sync).

    python -m benchmarks.async_generation [--steps 8] [--placements shared core_each] [--arms ARM...] [overrides...]

The overrides choose another experiment for every arm, after `--` where `--arms` is given: `python -m
benchmarks.async_generation --placements core_each --arms "sync (vllm_server)" "async, max_staleness=0" "async,
max_staleness=1" -- +experiment=calculator` times multi-turn rollouts played ahead (each trajectory turn by turn on
the server, docs/async.md).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.heldout_eval import cpu_name
from support.servers import free_port, vllm_server

ARMS = {
    "sync (vllm_server)": ["generation=vllm_server"],
    "async, max_staleness=0": ["generation=vllm_async", "trainer.max_staleness=0"],
    "async, max_staleness=1": ["generation=vllm_async", "trainer.max_staleness=1"],
    "async, max_staleness=2": ["generation=vllm_async", "trainer.max_staleness=2"],
}


def placement(name: str) -> tuple[tuple[str, ...], dict, tuple[str, ...], dict]:
    """(server prefix, server environment, trainer prefix, trainer environment) of a placement."""
    cores = sorted(os.sched_getaffinity(0))
    if name == "shared" or len(cores) < 2:
        return (), dict(os.environ), (), dict(os.environ)
    server_core, trainer_cores = cores[-1], cores[:-1]
    server_env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=str(server_core))
    trainer_env = dict(os.environ, OMP_NUM_THREADS=str(len(trainer_cores)))
    trainer_list = ",".join(map(str, trainer_cores))
    return ("taskset", "-c", str(server_core)), server_env, ("taskset", "-c", trainer_list), trainer_env


def steps_of(overrides: list[str], steps: int, port: int, prefix: tuple[str, ...], env: dict) -> list[dict]:
    """The logged records of a default run of `steps` steps against the server on `port`, no evaluation: each step's,
    then transformers' summary of the training (train_runtime)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            *prefix, sys.executable, "-m", "grpo_exp.train", *overrides, f"trainer.extra.vllm_server_port={port}",
            f"trainer.max_steps={steps}", "eval.before=false", "eval.after=false", "logger=none",
            "probe.labels_check=off", "save_model=false", "trainer.save_steps=0", f"hydra.run.dir={tmp}",
            "trainer.zero_variance_groups=keep",  # every step trains: its work does not hang on the groups' spread
        ]  # fmt: skip
        completed = subprocess.run(command, capture_output=True, text=True, env=env)
        if completed.returncode != 0:
            raise SystemExit(f"{overrides} failed:\n{completed.stderr[-3000:]}")
        lines = (Path(tmp) / "metrics.jsonl").read_text().splitlines()
        return [record for record in map(json.loads, lines) if "step_time" in record or "train_runtime" in record]


def median_of(records: list[dict], key: str) -> float | None:
    """The median over the steps after the first (which fills the pipeline)."""
    values = [record[key] for record in records[1:] if key in record]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_generation")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--placements", nargs="+", default=["shared", "core_each"], choices=["shared", "core_each"])
    arms = list(ARMS)
    parser.add_argument("--arms", nargs="+", default=arms, choices=arms, metavar="ARM", help=", ".join(arms))
    parser.add_argument("overrides", nargs="*", help="the experiment, for every arm (+experiment=calculator)")
    args = parser.parse_args(argv)
    task = " ".join(args.overrides) or "the default task"
    print(f"generation ahead against synchronous, {task}, embedded SmolLM2-135M float32, {cpu_name()}")
    print(f"{len(os.sched_getaffinity(0))} cores; medians of steps 2..{args.steps}")
    print("| placement | arm | s/step (wall) | TRL's step_time | waited for the server | weight sync | staleness |")
    print("|---|---|---|---|---|---|---|")
    for name in args.placements:
        server_prefix, server_env, trainer_prefix, trainer_env = placement(name)
        port = free_port()
        shares = {}
        with vllm_server(port, prefix=server_prefix, env=server_env):
            for arm in args.arms:
                records = steps_of([*args.overrides, *ARMS[arm]], args.steps, port, trainer_prefix, trainer_env)
                runtime = next(record["train_runtime"] for record in records if "train_runtime" in record)
                figures = {"wall": runtime / args.steps, "step_time": median_of(records, "step_time")}
                for key in ("async/wait_seconds", "async/sync_seconds", "async/staleness_max"):
                    figures[key] = median_of(records, key)
                shares[arm] = figures
                shown = ["-" if value is None else f"{value:.2f}" for value in figures.values()]
                print(f"| {name} | {arm} | {' | '.join(shown)} |", flush=True)
        if "async, max_staleness=0" not in shares:
            continue
        synchronous = shares["async, max_staleness=0"]  # its wait is all of generation: the step's shares
        step, generation = synchronous["wall"], synchronous["async/wait_seconds"]
        sync = synchronous["async/sync_seconds"]
        training = step - generation - sync
        overlapped = step / max(generation, training + sync)
        print(
            f"  {name}: a synchronous step {step:.2f} s = generation {generation:.2f} + weight sync {sync:.2f} + "
            f"training {training:.2f}; with generation on its own device, at most {overlapped:.2f}x"
        )
        for arm in [a for a in ("async, max_staleness=1", "async, max_staleness=2") if a in shares]:
            speed = step / shares[arm]["wall"]
            print(f"  {name}: {arm}: {speed:.2f}x the synchronous pipeline's steps per minute")


if __name__ == "__main__":
    main()
