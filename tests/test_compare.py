"""The compare tool and its notebook, on a small real multirun of the tiny model made here; its statistics across
seeds on run directories written here with known numbers."""

import csv
import json
import math
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from grpo_exp.analysis.comparison import side_by_side
from grpo_exp.compare import main as compare_main
from grpo_exp.paths import REPO_ROOT
from grpo_exp.run_files import METRICS_FILE, STATUS_FILE, SUMMARY_FILE
from tests.helpers.cli import copied_run, run_cli, run_command


@pytest.fixture(scope="module")
def compared_sweep(tiny_sweep, tmp_path_factory):
    """A copy of tests/conftest.py's tiny_sweep (G = 2 and 3, three steps each): the tools write into it."""
    return copied_run(tiny_sweep, tmp_path_factory.mktemp("compared") / "sweep")


@pytest.mark.e2e
def test_compare_writes_a_table_and_plots_of_the_sweep(compared_sweep, capsys):
    assert compare_main([str(compared_sweep)]) == 0
    printed = capsys.readouterr().out
    assert "trainer.num_generations" in printed  # the swept parameter is a column
    rows = (compared_sweep / "compare" / "comparison.csv").read_text().splitlines()
    assert rows[0].startswith("run,trainer.num_generations,status,steps,final reward,best reward")
    assert len(rows) == 3 and {r.split(",")[1] for r in rows[1:]} == {"2", "3"}
    assert all(r.split(",")[2:4] == ["finished", "3"] for r in rows[1:])  # three steps each
    plot = compared_sweep / "compare" / "reward.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (compared_sweep / "compare" / "groups_pass_at_1.png").is_file()


def test_compare_refuses_a_directory_without_runs(tmp_path):
    with pytest.raises(SystemExit):
        compare_main([str(tmp_path)])


def test_compare_names_each_path_that_is_no_directory(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a run")
    with pytest.raises(SystemExit) as stop:
        compare_main([str(tmp_path / "notes.txt"), str(tmp_path / "missing")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2
    assert error.endswith(f"{tmp_path / 'notes.txt'}: not a directory; {tmp_path / 'missing'}: no such directory")


@pytest.mark.e2e
def test_the_notebook_runs_on_the_sweep(compared_sweep, monkeypatch):
    monkeypatch.setenv("GRPO_EXP_RUNS", str(compared_sweep))
    notebook = nbformat.read(REPO_ROOT / "notebooks" / "compare_runs.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
    ).execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    assert "2 runs under" in outputs and "['trainer.num_generations']" in outputs
    assert any("image/png" in o.get("data", {}) for cell in notebook.cells for o in cell.get("outputs", []))


@pytest.mark.e2e
def test_the_learning_curve_report_summarises_runs_and_draws_the_figure(compared_sweep, capsys):
    from benchmarks.learning_curve import main as curve_main

    figure = compared_sweep / "curve.png"
    curve_main([str(compared_sweep), "--out", str(figure)])
    printed = capsys.readouterr().out
    assert "2 seeds" in printed and "held-out accuracy after:" in printed and "gain:" in printed
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.e2e
def test_the_overhead_benchmark_runs_both_variants_and_prints_the_ratios(capsys, monkeypatch):
    """The benchmark's machinery on the tiny model (the real numbers, embedded model: BENCHMARKS.md); each run still
    a process of its own, started warm."""
    from benchmarks import overhead
    from benchmarks.overhead import main as overhead_main

    monkeypatch.setattr(overhead, "run_command", lambda command: run_command(command, timeout=600))

    overhead_main(["--pairs", "1", "--steps", "2", "model=tiny", "trainer=debug", "dataset.train_size=64"])
    printed = capsys.readouterr().out
    assert "grpo_exp vs bare TRL" in printed and "peak memory (RSS)" in printed
    assert "rewards" in printed and "group statistics" in printed and "logging: W&B per step" in printed


@pytest.mark.e2e
def test_the_time_to_accuracy_benchmark_runs_each_arm_and_continues_where_it_stopped(tmp_path, capsys, monkeypatch):
    """The benchmark's machinery on the tiny model (the real numbers, embedded model: BENCHMARKS.md); each run still
    a process of its own, started warm."""
    from benchmarks import time_to_accuracy
    from benchmarks.time_to_accuracy import main as time_main

    monkeypatch.setattr(time_to_accuracy, "run_command", lambda command: run_command(command, timeout=600))

    results, figure = tmp_path / "results.json", tmp_path / "figure.png"
    tiny = ["model=tiny", "trainer=debug", "dataset.eval_size=4", "dataset.train_size=64", "logger=none"]
    time_main(["--seeds", "1", "--arms", "trl", "best", "--results", str(results), "--out", str(figure), *tiny])
    printed = capsys.readouterr().out
    assert "seed 1 trl" in printed and "seed 1 best" in printed and "wall time best / bare TRL" in printed
    assert {r["arm"] for r in json.loads(results.read_text())} == {"trl", "best"}
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    time_main(["--seeds", "1", "--arms", "trl", "best", "--results", str(results), "--out", str(figure), *tiny])
    printed = capsys.readouterr().out
    assert "2 runs of the current settings are kept" in printed and "seed 1 trl" not in printed  # nothing rerun
    runs = json.loads(results.read_text())
    next(r for r in runs if r["arm"] == "best")["settings"] = ["trainer.zero_variance_groups=keep"]  # an old `best`
    results.write_text(json.dumps(runs))
    time_main(["--seeds", "1", "--arms", "trl", "best", "--results", str(results), "--out", str(figure), *tiny])
    printed = capsys.readouterr().out
    assert "1 runs of the current settings are kept, 1 of other settings are ignored" in printed
    assert "seed 1 best" in printed and "seed 1 trl" not in printed  # the changed arm alone is measured again


def test_a_steps_time_counts_what_generation_ahead_did_before_trls_step_time():
    """generation=vllm_async syncs the weights where transformers draws the step's batches, before TRL's step_time
    starts: a step's time (compare's s/step, time to accuracy) adds it; validating is still not training."""
    from benchmarks.time_to_accuracy import validations
    from grpo_exp.run_files import BEFORE_STEP_SECONDS, step_seconds

    assert step_seconds({"step": 1, "step_time": 2.0, BEFORE_STEP_SECONDS: 0.5}) == 2.5
    assert step_seconds({"step": 1, "step_time": 2.0}) == 2.0  # a synchronous run's
    assert step_seconds({"step": 1, "heldout/accuracy": 0.5}) is None  # not a training step's record
    metrics = [{"step": 1, "step_time": 2.0, BEFORE_STEP_SECONDS: 0.5, "heldout/accuracy": 0.3}]
    assert validations(metrics) == [[1, 2.5, 0.3]]


def test_time_to_accuracy_is_the_training_time_through_the_first_validation_at_the_target(capsys):
    """Training time sums TRL's step_time (validating is not training); the first validation at or above the bare
    TRL run's final accuracy of the same seed counts; the ratio is taken seed by seed."""
    from benchmarks.time_to_accuracy import report_time_to, time_to, validations

    metrics = [{"step": s, "step_time": 10.0 * s} for s in range(1, 5)]  # 10, 30, 60, 100 s through steps 1-4
    metrics[1] |= {"heldout/accuracy": 0.30}
    metrics[3] |= {"heldout/accuracy": 0.45}
    points = validations(list(reversed(metrics)))
    assert points == [[2, 30.0, 0.30], [4, 100.0, 0.45]]
    assert time_to(0.30, points) == (2, 30.0) and time_to(0.40, points) == (4, 100.0) and time_to(0.5, points) is None
    # a warm-up's seconds (warmup=sft) come before the first step: its run reaches the target that much later
    assert validations(list(reversed(metrics)), start=25.0) == [[2, 55.0, 0.30], [4, 125.0, 0.45]]

    def run(arm, seed, **fields):
        return {"arm": arm, "seed": seed, "every": 2, **fields}

    results = [
        run("trl", 1, accuracy_after=0.40),
        run("trl", 2, accuracy_after=0.30),
        run("trl", 3, accuracy_after=0.90),
        run("defaults", 1, validations=[[2, 50.0, 0.35], [4, 100.0, 0.40]]),
        run("defaults", 2, validations=[[2, 40.0, 0.30]]),
        run("defaults", 3, validations=[[2, 40.0, 0.30]]),
        run("curriculum", 1, validations=[[2, 50.0, 0.40]]),  # 50 / 100
        run("curriculum", 2, validations=[[2, 30.0, 0.20], [4, 60.0, 0.31]]),  # 60 / 40
        run("curriculum", 3, validations=[[2, 30.0, 0.20]]),  # neither reached 0.90
    ]
    report_time_to(results, ["trl", "defaults", "curriculum"], "defaults")
    printed = capsys.readouterr().out
    assert "seed 1: target 0.400; defaults step 4, 1.67 min; curriculum step 2, 0.83 min; ratio 0.500" in printed
    assert "ratio 1.500" in printed and "seed 3: target 0.900; defaults not reached; curriculum not reached" in printed
    # mean 1.0; sd of (0.5, 1.5) = 0.7071; half-width 12.706 * 0.7071 / sqrt(2) = 6.353
    assert "curriculum / defaults: 1.000, 95% t-interval [-5.353, 7.353] over 2 seeds" in printed


# ---- across seeds, on run directories with known numbers --------------------------------------------------------

T_2 = 4.302653  # Student t, 97.5% quantile, 2 degrees of freedom (3 seeds or pairs): from a table
T_1 = 12.706205  # ... 1 degree of freedom (2 seeds or pairs)
# Held-out accuracy after training, by beta and seed. beta=0.0: mean 0.6, sample sd 0.1. beta=0.04 minus beta=0.0,
# seed by seed: 0.05, 0.10, 0.15: mean 0.10, sample sd 0.05.
AFTER = {"0.0": {42: 0.50, 43: 0.60, 44: 0.70}, "0.04": {42: 0.55, 43: 0.70, 44: 0.85}}


def write_run(directory: Path, overrides: list[str], after: float) -> None:
    """The files compare reads, as a finished run writes them: Hydra's overrides, the summary, the metrics (4 steps,
    validations at steps 2 and 4 with eval.every=2) and a sweep job's status."""
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    summary = {
        "steps": 4,
        "train_seconds": 100.0,
        "heldout_accuracy_before": 0.4,
        "heldout_accuracy_after": after,
        "best_step": 4,
        "best_heldout_accuracy": after,
    }
    (directory / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    steps = [
        {"step": step, "reward": 0.1 * step, "rewards/math/mean": after, "rewards/format/mean": 0.5, "step_time": 25.0}
        for step in range(1, 5)
    ]
    steps[1]["heldout/accuracy"], steps[3]["heldout/accuracy"] = after - 0.1, after
    (directory / METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in steps))
    (directory / STATUS_FILE).write_text(json.dumps({"status": "finished"}))


def write_sweep(sweep: Path, after: dict[str, dict[int, float]]) -> Path:
    """A multirun over trainer.seed x trainer.beta (Hydra's job order: the first key varies slowest)."""
    jobs = [(seed, beta) for seed in (42, 43, 44) for beta in after if seed in after[beta]]
    for number, (seed, beta) in enumerate(jobs):
        write_run(sweep / str(number), [f"trainer.seed={seed}", f"trainer.beta={beta}"], after[beta][seed])
    return sweep


def read_rows(path: Path, result: str) -> list[dict]:
    return [row for row in csv.DictReader(path.open()) if row["result"] == result]


def test_compare_reports_means_over_seeds_and_differences_paired_by_seed(tmp_path, capsys):
    sweep = write_sweep(tmp_path, AFTER)
    assert compare_main([str(sweep)]) == 0
    printed = capsys.readouterr().out
    zero, high = read_rows(sweep / "compare" / "settings.csv", "held-out after")
    assert zero["setting"] == "trainer.beta=0.0" and zero["seeds"] == "3"
    half = T_2 * 0.1 / math.sqrt(3)  # 0.2484
    assert float(zero["mean"]) == pytest.approx(0.6)
    assert float(zero["95% low"]) == pytest.approx(0.6 - half) and float(zero["95% high"]) == pytest.approx(0.6 + half)
    assert float(high["mean"]) == pytest.approx(0.7)
    [paired] = read_rows(sweep / "compare" / "paired.csv", "held-out after")
    half = T_2 * 0.05 / math.sqrt(3)  # 0.1242
    assert (paired["setting"], paired["baseline"], paired["pairs"]) == ("trainer.beta=0.04", "trainer.beta=0.0", "3")
    assert float(paired["mean difference"]) == pytest.approx(0.10)
    assert float(paired["95% low"]) == pytest.approx(0.10 - half) and float(paired["95% high"]) == pytest.approx(
        0.10 + half
    )
    assert paired["note"] == ""
    assert (
        "| trainer.beta=0.04 | trainer.beta=0.0 | held-out after | 3 | 0.100 | -0.024 | 0.224 |  |"
        in (sweep / "compare" / "paired.md").read_text().splitlines()
    )
    assert "0.352" in printed and "0.848" in printed  # beta=0.0's interval, printed
    assert "paired by seed: setting - baseline (trainer.beta=0.0)" in printed
    plot = sweep / "compare" / "heldout_by_setting.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_job_cut_short_mid_line_is_compared_and_a_damaged_one_is_named_beside_the_others(tmp_path, capsys):
    sweep = write_sweep(tmp_path, AFTER)
    with (sweep / "0" / METRICS_FILE).open("a") as metrics:
        metrics.write('{"step": 5, "rew')  # the line a stop cut short
    (sweep / "1" / SUMMARY_FILE).write_text('{"steps": 4,')
    assert compare_main([str(sweep)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"unreadable {sweep / '1'}: {sweep / '1' / SUMMARY_FILE}: not JSON" in printed
    rows = list(csv.DictReader((sweep / "compare" / "comparison.csv").open()))
    assert [row["status"] for row in rows] == ["finished", "unreadable", *["finished"] * (len(rows) - 2)]
    assert rows[0]["steps"] == "4"


def test_a_seed_in_one_setting_only_is_left_out_of_the_pairing(tmp_path):
    sweep = write_sweep(tmp_path, {"0.0": AFTER["0.0"], "0.04": {42: 0.55, 43: 0.70}})  # no seed 44 at beta=0.04
    assert compare_main([str(sweep), "--baseline", "trainer.beta=0.0"]) == 0
    [paired] = read_rows(sweep / "compare" / "paired.csv", "held-out after")
    half = T_1 * math.sqrt(0.5 * 0.05**2) / math.sqrt(2)  # differences 0.05, 0.10: sample sd 0.0354
    assert paired["pairs"] == "2" and float(paired["mean difference"]) == pytest.approx(0.075)
    assert float(paired["95% low"]) == pytest.approx(0.075 - half)
    assert paired["note"] == "left out, in one setting only: seed 44"
    means = read_rows(sweep / "compare" / "settings.csv", "held-out after")
    assert [row["seeds"] for row in means] == ["3", "2"]  # the means keep every seed a setting has


def test_a_single_seed_setting_has_a_mean_and_no_interval(tmp_path, capsys):
    sweep = write_sweep(tmp_path, {**AFTER, "0.1": {43: 0.9}})
    assert compare_main([str(sweep), "--baseline", "trainer.beta=0.1"]) == 0
    printed = capsys.readouterr().out
    single = next(row for row in read_rows(sweep / "compare" / "settings.csv", "held-out after") if row["seeds"] == "1")
    assert single["setting"] == "trainer.beta=0.1" and float(single["mean"]) == 0.9
    assert math.isnan(float(single["95% low"])) and single["note"] == "1 seed: no interval"
    for paired in read_rows(sweep / "compare" / "paired.csv", "held-out after"):  # against beta=0.1: seed 43 only
        assert paired["pairs"] == "1" and paired["note"].startswith("1 pair: no interval; left out")
    assert "1 seed: no interval" in printed and "baseline (trainer.beta=0.1)" in printed


def test_one_seed_per_setting_is_said_once_and_each_reward_component_is_compared(tmp_path, capsys):
    sweep = write_sweep(tmp_path, {"0.0": {42: 0.5}, "0.04": {42: 0.7}, "0.1": {42: 0.2}})
    assert compare_main([str(sweep)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("One seed per setting") == 1
    assert "1 seed: no interval" not in printed and "1 pair: no interval" not in printed  # not once per row
    means = list(csv.DictReader((sweep / "compare" / "settings.csv").open()))
    assert "95% low" not in means[0] and "note" not in means[0]
    math_rows = [row for row in means if row["result"] == "reward/math"]
    assert [float(row["mean"]) for row in math_rows] == [0.5, 0.7, 0.2]  # each component, unweighted
    runs = list(csv.DictReader((sweep / "compare" / "comparison.csv").open()))
    assert [float(row["reward/format"]) for row in runs] == [0.5, 0.5, 0.5]
    paired = [
        row for row in csv.DictReader((sweep / "compare" / "paired.csv").open()) if row["result"] == "reward/math"
    ]
    assert [float(row["mean difference"]) for row in paired] == pytest.approx([0.2, -0.3])


def test_a_baseline_that_names_no_setting_is_refused_with_the_settings_there_are(tmp_path, capsys):
    sweep = write_sweep(tmp_path, AFTER)
    with pytest.raises(SystemExit):
        compare_main([str(sweep), "--baseline", "trainer.beta=0.5"])
    error = capsys.readouterr().err
    assert "--baseline: 'trainer.beta=0.5' is none of the settings: trainer.beta=0.0 | trainer.beta=0.04" in error
    assert not (sweep / "compare").exists()  # refused before anything was written


def test_the_compare_command_line_across_seeds(tmp_path):
    sweep = write_sweep(tmp_path, AFTER)
    result = run_cli(str(sweep), "--baseline", "trainer.beta=0.04", module="grpo_exp.compare", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mean over seeds per setting" in result.stdout and "baseline (trainer.beta=0.04)" in result.stdout
    for name in ("settings.csv", "settings.md", "paired.csv", "paired.md", "heldout_by_setting.png"):
        assert (sweep / "compare" / name).is_file()


def test_the_settings_squares_stand_side_by_side_centred_on_their_step():
    shifts = [side_by_side(index, 5, last_step=40) for index in range(5)]
    assert shifts == pytest.approx([-0.8, -0.4, 0.0, 0.4, 0.8])  # 1% of 40 steps apart, apart from each other
    assert side_by_side(0, 1, last_step=40) == 0.0  # one setting: on its step
    assert side_by_side(1, 2, last_step=0) == pytest.approx(0.005)  # before training only: still apart
