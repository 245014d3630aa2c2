"""The compare tool and its notebook, on a small real multirun of the tiny model made here."""

import json

import nbformat
import pytest
from nbclient import NotebookClient

from grpo_exp.compare import main as compare_main
from grpo_exp.paths import REPO_ROOT
from tests.helpers.cli import run_cli


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("sweep")
    result = run_cli(
        "-m", "+experiment=smoke", "trainer.num_generations=2,3", "trainer.max_steps=3", f"hydra.sweep.dir={sweep}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep


@pytest.mark.e2e
def test_compare_writes_a_table_and_plots_of_the_sweep(tiny_sweep, capsys):
    assert compare_main([str(tiny_sweep)]) == 0
    printed = capsys.readouterr().out
    assert "trainer.num_generations" in printed  # the swept parameter is a column
    rows = (tiny_sweep / "compare" / "comparison.csv").read_text().splitlines()
    assert rows[0].startswith("run,trainer.num_generations,status,steps,final reward,best reward")
    assert len(rows) == 3 and {r.split(",")[1] for r in rows[1:]} == {"2", "3"}
    assert all(r.split(",")[2:4] == ["finished", "3"] for r in rows[1:])  # three steps each
    plot = tiny_sweep / "compare" / "reward.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tiny_sweep / "compare" / "groups_pass_at_1.png").is_file()


def test_compare_refuses_a_directory_without_runs(tmp_path):
    with pytest.raises(SystemExit):
        compare_main([str(tmp_path)])


@pytest.mark.e2e
def test_the_notebook_runs_on_the_sweep(tiny_sweep, monkeypatch):
    monkeypatch.setenv("GRPO_EXP_RUNS", str(tiny_sweep))
    notebook = nbformat.read(REPO_ROOT / "notebooks" / "compare_runs.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
    ).execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    assert "2 runs under" in outputs and "['trainer.num_generations']" in outputs
    assert any("image/png" in o.get("data", {}) for cell in notebook.cells for o in cell.get("outputs", []))


@pytest.mark.e2e
def test_the_learning_curve_report_summarises_runs_and_draws_the_figure(tiny_sweep, capsys):
    from benchmarks.learning_curve import main as curve_main

    figure = tiny_sweep / "curve.png"
    curve_main([str(tiny_sweep), "--out", str(figure)])
    printed = capsys.readouterr().out
    assert "2 seeds" in printed and "held-out accuracy after:" in printed and "gain:" in printed
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.e2e
def test_the_overhead_benchmark_runs_both_variants_and_prints_the_ratios(capsys):
    """The benchmark's machinery on the tiny model (the real numbers, embedded model: BENCHMARKS.md)."""
    from benchmarks.overhead import main as overhead_main

    overhead_main(["--pairs", "1", "--steps", "2", "model=tiny", "trainer=debug", "dataset.train_size=64"])
    printed = capsys.readouterr().out
    assert "grpo_exp vs bare TRL" in printed and "peak memory (RSS)" in printed
    assert "rewards" in printed and "group statistics" in printed and "logging: W&B per step" in printed


@pytest.mark.e2e
def test_the_time_to_accuracy_benchmark_runs_each_arm_and_continues_where_it_stopped(tmp_path, capsys):
    """The benchmark's machinery on the tiny model (the real numbers, embedded model: BENCHMARKS.md)."""
    from benchmarks.time_to_accuracy import main as time_main

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
