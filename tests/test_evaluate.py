"""`python -m grpo_exp.evaluate` on a run directory, a checkpoint and a model config."""

import json

import pytest
import yaml

from grpo_exp.evaluate import resolve_source
from grpo_exp.run_files import latest_evaluation, new_evaluation_files
from tests.helpers.cli import copied_run, run_cli


@pytest.fixture(scope="module")
def tiny_run(tiny_cli_run, tmp_path_factory):
    """A copy of the shared tiny run (tests/conftest.py's tiny_cli_run): evaluate writes into the run directory."""
    return copied_run(tiny_cli_run, tmp_path_factory.mktemp("evaluated") / "run")


@pytest.mark.e2e
def test_evaluate_a_run_directory_with_samples(tiny_run):
    result = run_cli(str(tiny_run), "eval.samples=2", module="grpo_exp.evaluate")
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(latest_evaluation(tiny_run).read_text())
    assert results["model"] == str((tiny_run / "checkpoint-final").resolve())
    assert results["problems"] == 4  # the run's own held-out split (TINY_RUN: eval_size 4)
    assert {"greedy accuracy", "pass@1", "pass@2", "maj@2"} <= set(results)
    assert "greedy accuracy" in result.stdout
    # what it was measured with, and each problem's answers with their labels
    assert results["labels"] == "math_verify" and results["answer"] == "stated"
    assert results["overrides"][-1] == "eval.samples=2" and "model=tiny" in results["overrides"]  # the run's, then mine
    answers = [json.loads(line) for line in (tiny_run / results["answers_file"]).read_text().splitlines()]
    assert len(answers) == 4 and all(len(a["samples"]) == 2 for a in answers)
    greedy = [a["greedy"]["correct"] for a in answers]
    assert results["greedy accuracy"] == pytest.approx(sum(greedy) / 4)
    sampled = [s["correct"] for a in answers for s in a["samples"]]
    assert results["pass@1"] == pytest.approx(sum(sampled) / 8)
    assert all({"completion", "answer", "correct"} <= set(s) for a in answers for s in a["samples"])


@pytest.mark.e2e
def test_evaluate_reports_the_verification_benchmark_of_a_run_directory(tiny_run):
    from grpo_exp.verification.benchmark import save_benchmark
    from grpo_exp.verification.selfverify import Candidate

    examples = [Candidate(i, f"Calculate {i} + 1.", "", str(i + 1 + (i % 2)), i % 2 == 0, 0.5) for i in range(6)]
    save_benchmark(examples, tiny_run / "verification_benchmark.json")  # the run's own set is measured, not rebuilt
    earlier = {path: path.read_text() for path in tiny_run.glob("evaluation*")}
    result = run_cli(
        str(tiny_run),
        "eval.samples=0",
        "eval.verification_benchmark.enabled=true",
        "eval.verification_benchmark.resamples=50",
        module="grpo_exp.evaluate",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(latest_evaluation(tiny_run).read_text())
    assert results["verify_bench/examples"] == 6.0
    assert {path: path.read_text() for path in earlier} == earlier  # an earlier evaluation is kept as it was
    assert len(list(tiny_run.glob("evaluation*.json"))) == len(earlier) // 2 + 1
    assert results["verify_bench/auroc_low"] <= results["verify_bench/auroc"] <= results["verify_bench/auroc_high"]
    assert "verify_bench/balanced_accuracy" in result.stdout


@pytest.mark.e2e
def test_evaluate_a_checkpoint_and_a_model_config(tiny_run, tmp_path, monkeypatch):
    checkpoint = tiny_run / "checkpoint-final"
    result = run_cli(str(checkpoint), "dataset.eval_size=3", "eval.samples=0", module="grpo_exp.evaluate")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(latest_evaluation(checkpoint).read_text())["problems"] == 3
    monkeypatch.chdir(tmp_path)
    result = run_cli("model=tiny", "dataset.eval_size=2", "eval.samples=0", module="grpo_exp.evaluate")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list(tmp_path.glob("outputs/eval/*/evaluation.json"))) == 1


def test_evaluate_writes_under_the_configured_outputs_dir(tmp_path, monkeypatch):
    from grpo_exp.evaluate import main

    monkeypatch.chdir(tmp_path)
    main(["model=tiny", "dataset.eval_size=2", "eval.samples=0", f"outputs_dir={tmp_path / 'elsewhere'}"])
    assert len(list(tmp_path.glob("elsewhere/eval/*/evaluation.json"))) == 1
    assert not (tmp_path / "outputs").exists()


def test_a_new_evaluation_never_overwrites_an_earlier_one(tmp_path):
    assert latest_evaluation(tmp_path) is None
    written = []
    for _ in range(3):
        results, answers = new_evaluation_files(tmp_path)
        results.write_text("{}")
        answers.write_text("")
        written.append((results.name, answers.name))
        assert latest_evaluation(tmp_path) == results
    assert written == [
        ("evaluation.json", "evaluation.jsonl"),
        ("evaluation_2.json", "evaluation_2.jsonl"),
        ("evaluation_3.json", "evaluation_3.jsonl"),
    ]


def test_the_recorded_overrides_mask_secrets():
    from grpo_exp.run.tracking import masked_override

    given = ["judge.api_key=sk-123", "judge.base_url=http://u:pw@host/v1", "eval.samples=2"]
    shown = [masked_override(o) for o in given]
    assert "sk-123" not in str(shown) and "pw@" not in str(shown) and shown[2] == "eval.samples=2"


def test_evaluate_refuses_what_is_not_a_run_or_checkpoint(tmp_path):
    result = run_cli(str(tmp_path), module="grpo_exp.evaluate")
    assert result.returncode != 0 and "not a grpo_exp run directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_runner_up_checkpoint_is_evaluated_with_its_runs_config(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["dataset=chain_sum", "hydra.job.name=x"]))
    runner_up = tmp_path / "checkpoint-top" / "step-20"
    runner_up.mkdir(parents=True)
    source = resolve_source([str(runner_up)])
    assert "dataset=chain_sum" in source.overrides
    assert f"model.name_or_path={runner_up.resolve()}" in source.overrides
