"""eval.every: held-out validation while training, and checkpoint-best."""

import json
import math
from pathlib import Path

import pytest

from grpo_exp.analysis.alarms import hacking_alarm
from grpo_exp.errors import UserError
from grpo_exp.measures import (
    accuracy_change_interval,
    accuracy_standard_error,
    auroc_change_interval,
    auroc_standard_error,
    slope_interval,
)
from grpo_exp.run.kept_models import Best, KeptModels, best_of, ranked
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run.validation import (
    PeriodicValidation,
    Schedule,
    check_validation,
    metric_standard_error,
    stop_reason,
    validations_without_improvement,
)
from grpo_exp.run_files import latest_evaluation
from grpo_exp.schema import AlarmAction
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import CliRun, copied_run, run_cli


def test_the_best_validation_is_the_highest_and_ties_go_to_the_earlier_step():
    history = [
        {"step": 1, "reward": 0.1},
        {"step": 2, "heldout/accuracy": 0.3},
        {"step": 4, "heldout/accuracy": math.nan},
        {"step": 6, "heldout/accuracy": 0.5},
        {"step": 8, "heldout/accuracy": 0.5},
        {"step": 10, "heldout/accuracy": 0.2},
    ]
    assert best_of(history) == Best(6, 0.5)
    assert best_of([{"step": 1, "reward": 0.1}]) is None
    assert best_of([{"step": 3, "heldout/accuracy": math.nan}]) is None


def test_validation_must_fall_on_a_logged_step():
    cfg = compose_config(["eval.every=3", "trainer.logging_steps=2"])
    with pytest.raises(UserError, match=r"eval.every=3 .* trainer.logging_steps=2"):
        check_validation(cfg.eval, cfg.trainer)
    cfg = compose_config(["eval.every=4", "trainer.logging_steps=2"])
    check_validation(cfg.eval, cfg.trainer)


def test_gains_within_one_standard_error_do_not_reset_the_patience():
    assert accuracy_standard_error(0.5, 100) == pytest.approx(0.05)
    assert 0 < accuracy_standard_error(0.0, 100) < accuracy_standard_error(0.5, 100), (
        "0 correct still carries its uncertainty"
    )

    def errors(values):
        return [accuracy_standard_error(v, 100) if v == v else math.nan for v in values]

    # on 100 problems: 0.40 -> 0.43 is within noise (~0.049), 0.40 -> 0.46 is not
    assert validations_without_improvement([0.40, 0.43, 0.42], errors([0.40, 0.43, 0.42])) == 2
    assert validations_without_improvement([0.40, 0.43, 0.46], errors([0.40, 0.43, 0.46])) == 0
    assert validations_without_improvement([0.40, math.nan], errors([0.40, math.nan])) == 0, "NaN: nothing measured"
    values = [0.40, 0.43, 0.42]
    assert stop_reason(values, errors(values), patience=2, stop_at=None).startswith("no held-out improvement")
    assert stop_reason(values[:2], errors(values[:2]), patience=2, stop_at=None) is None
    assert "reached eval.stop_at=0.5" in stop_reason([0.2, 0.55], errors([0.2, 0.55]), patience=None, stop_at=0.5)


def test_each_validation_metric_has_its_own_noise():
    metrics = {"heldout/accuracy": 0.5, "heldout/maj@4": 0.6, "heldout/judge/auroc": 0.7, "heldout/judge/mean": 0.8}
    assert metric_standard_error("heldout/maj@4", metrics, 100) == accuracy_standard_error(0.6, 100)
    # the AUROC's from the 50 right and 50 wrong answers of that validation
    assert metric_standard_error("heldout/judge/auroc", metrics, 100) == auroc_standard_error(0.7, 50, 50)
    # a mean score in [0, 1]: the binomial error bounds it
    assert metric_standard_error("heldout/judge/mean", metrics, 100) == accuracy_standard_error(0.8, 100)


def test_the_top_k_are_the_highest_and_ties_go_to_the_earlier_step():
    kept = ranked([], Best(0, 0.25), 2)
    kept = ranked(kept, Best(10, 0.31), 2)
    assert kept == [Best(10, 0.31), Best(0, 0.25)]
    assert ranked(kept, Best(20, 0.25), 2) == kept, "a tie with the runner-up: the earlier step stays"
    assert ranked(kept, Best(20, 0.28), 2) == [Best(10, 0.31), Best(20, 0.28)]
    assert ranked(kept, Best(20, 0.28), 1) == [Best(10, 0.31)]


def test_the_best_metric_must_be_one_the_validations_measure():
    cfg = compose_config(["eval.every=2", "trainer.logging_steps=1", "eval.best_metric=heldout/maj@4"])
    with pytest.raises(UserError, match=r"eval.best_metric=heldout/maj@4 is not measured .* heldout/accuracy"):
        check_validation(cfg.eval, cfg.trainer)
    cfg = compose_config(
        ["eval.every=2", "trainer.logging_steps=1", "eval.every_samples=4", "eval.best_metric=heldout/maj@4"]
    )
    check_validation(cfg.eval, cfg.trainer)
    cfg = compose_config(["eval.every=2", "trainer.logging_steps=1", "eval.best_metric=heldout/judge/auroc"])
    with pytest.raises(UserError, match=r"heldout/judge/auroc is not measured"):
        check_validation(cfg.eval, cfg.trainer)
    check_validation(cfg.eval, cfg.trainer, learned=("judge",))
    for key, value in (("best_metric", "heldout/maj@4"), ("keep_top_k", 2)):
        cfg = compose_config([f"eval.{key}={value}"])
        with pytest.raises(UserError, match=rf"eval.{key}={value} chooses among validations: set eval.every"):
            check_validation(cfg.eval, cfg.trainer)


def test_the_k_best_models_are_kept_and_the_best_is_checkpoint_best(tmp_path):
    """The callback as training calls it: validations 0.25, 0.31, 0.20, 0.28, 0.35 with keep_top_k=2; each saved
    model is a file naming its step, so where it ends up shows which model is where."""
    from transformers import TrainerControl, TrainerState

    accuracies = iter([0.25, 0.31, 0.20, 0.28, 0.35])
    state, control = TrainerState(), TrainerControl()

    def save(directory):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "model").write_text(str(state.global_step))

    callback = PeriodicValidation(
        Schedule(10, problems=100, alarm=AlarmAction.off),
        validate=lambda: {"heldout/accuracy": next(accuracies)},
        record=lambda key, value: None,
        log_now=lambda metrics: None,
        kept=KeptModels(tmp_path, save, keep_top_k=2),
    )

    def models():
        return {
            str(path.relative_to(tmp_path)): int((path / "model").read_text())
            for path in [tmp_path / "checkpoint-best", *(tmp_path / "checkpoint-top").glob("*")]
            if path.exists()
        }

    callback.on_train_begin(None, state, control)
    seen = [models()]
    for step in (10, 20, 30, 40):
        state.global_step = step
        callback.on_step_end(None, state, control)
        seen.append(models())
    assert seen == [
        {"checkpoint-best": 0},
        {"checkpoint-best": 10, "checkpoint-top/step-0": 0},
        {"checkpoint-best": 10, "checkpoint-top/step-0": 0},  # 0.20 enters no top 2
        {"checkpoint-best": 10, "checkpoint-top/step-30": 30},  # 0.28 replaces 0.25
        {"checkpoint-best": 40, "checkpoint-top/step-10": 10},  # the best dethroned, the runner-up dropped
    ]
    assert json.loads((tmp_path / "checkpoint-best" / "best.json").read_text()) == {
        "step": 40,
        "metric": "heldout/accuracy",
        "value": 0.35,
        "heldout/accuracy": 0.35,
    }
    summary = callback.summary()
    assert summary["best_step"] == 40 and summary["best_heldout_accuracy"] == 0.35
    assert [entry["step"] for entry in summary["top_k"]] == [40, 10]

    # resumed from step 30 in the same directory: the step-40 model is trained again, so it goes; step 10 is best
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "heldout/accuracy": a}) + "\n"
            for s, a in ((0, 0.25), (10, 0.31), (20, 0.2), (30, 0.28))
        )
    )
    state.global_step = 30
    resumed = PeriodicValidation(Schedule(10, 100), None, None, None, KeptModels(tmp_path, save, keep_top_k=2))
    resumed.on_train_begin(None, state, control)
    assert resumed.kept.kept == [Best(10, 0.31)] and models() == {"checkpoint-best": 10}


def test_early_stopping_and_sampling_need_validations():
    for key, value, role in (
        ("patience", 2, "stops on"),
        ("stop_at", 0.5, "stops on"),
        ("every_samples", 4, "samples at"),
    ):
        cfg = compose_config([f"eval.{key}={value}"])
        with pytest.raises(UserError, match=rf"eval.{key}={value} {role} validations: set eval.every"):
            check_validation(cfg.eval, cfg.trainer)


@pytest.mark.e2e
def test_training_stops_when_the_patience_is_spent(tmp_path):
    result = run_cli(
        *TINY_RUN,
        "eval.every=1",
        "eval.every_problems=2",
        "eval.patience=1",
        "trainer.max_steps=4",
        "logger=none",
        "eval.before=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    # the random tiny model scores 0 every time: step 1 brings no gain over the initial model (step 0), and
    # patience 1 is spent
    assert summary["steps"] == 1 and summary["stopped_early"].startswith("step 1: no held-out improvement")
    assert "Training stops early at step 1" in result.stdout + result.stderr


# Validation at every step of a tiny run, its resumable checkpoints kept (to resume from).
VALIDATED = [*TINY_RUN, "eval.every=1", "eval.every_problems=2", "logger=none", "eval.before=false"]


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory) -> CliRun:
    run_dir = tmp_path_factory.mktemp("validated") / "run"
    result = run_cli(*VALIDATED, "trainer.save_steps=1", "trainer.keep_checkpoints=true", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return CliRun(run_dir, result)


@pytest.mark.e2e
def test_validation_every_step_is_logged_at_its_step_and_the_best_checkpoint_kept(validated_run):
    run_dir = validated_run.run_dir
    metrics = read_metrics(run_dir / "metrics.jsonl")
    steps = {m["step"]: m for m in metrics if "reward" in m}
    assert sorted(steps) == [1, 2] and all("heldout/accuracy" in m for m in steps.values())
    initial = [m for m in metrics if m["step"] == 0]
    assert len(initial) == 1 and "heldout/accuracy" in initial[0], "the initial model, validated at step 0"
    assert "held-out now" in validated_run.console
    best = json.loads((run_dir / "checkpoint-best" / "best.json").read_text())
    assert best["step"] == 0, "the random tiny model scores 0 at every step: a tie goes to the earliest, the initial"
    assert list((run_dir / "checkpoint-best").glob("*.safetensors"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best_step"] == 0 and summary["checkpoint_best"].endswith("checkpoint-best")


@pytest.mark.e2e
def test_validations_do_not_count_as_training_time(validated_run):
    """summary.json splits trainer.train()'s wall time: the validations (each logged with its own timing) and the
    best checkpoints they keep go to validation_seconds; train_seconds is the rest, at least the steps' own time."""
    summary = json.loads((validated_run.run_dir / "summary.json").read_text())
    metrics = read_metrics(validated_run.run_dir / "metrics.jsonl")
    validating = sum(m.get("timing/validation_s", 0.0) for m in metrics)
    stepping = sum(m.get("step_time", 0.0) for m in metrics)
    assert validating > 0 and summary["validation_seconds"] >= validating
    assert summary["train_seconds"] == pytest.approx(summary["wall_seconds"] - summary["validation_seconds"])
    assert stepping * 0.9 <= summary["train_seconds"] < summary["wall_seconds"] - validating
    assert summary["seconds_per_step"] == pytest.approx(summary["train_seconds"] / summary["steps"])


@pytest.mark.e2e
def test_evaluate_takes_the_best_checkpoint_with_its_runs_config(validated_run, tmp_path):
    """`evaluate` on checkpoint-best (a copy of the run: it writes beside the checkpoint) reads the run's config."""
    run_dir = copied_run(validated_run, tmp_path / "run")
    evaluated = run_cli(str(run_dir / "checkpoint-best"), "eval.samples=0", module="grpo_exp.evaluate")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(latest_evaluation(run_dir / "checkpoint-best").read_text())["problems"] == 4


@pytest.mark.e2e
def test_a_resumed_run_keeps_its_validation_history_and_its_best_checkpoint(validated_run, tmp_path):
    checkpoint = validated_run.run_dir / "trainer" / "checkpoint-2"  # the last one kept (save_total_limit)
    resumed = run_cli(*VALIDATED, "trainer.max_steps=3", f"trainer.resume={checkpoint}", f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl") if "heldout/accuracy" in m]
    assert logged == [0, 1, 2, 3], "steps 0 to 2 carried from the first attempt (step 0 not validated again), 3 now"
    assert json.loads((tmp_path / "checkpoint-best" / "best.json").read_text())["step"] == 0
    assert json.loads((tmp_path / "summary.json").read_text())["best_step"] == 0


def test_the_slope_interval_of_a_clean_line_is_tight_and_of_noise_straddles_zero():
    slope, low, high = slope_interval([1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 0.3, 0.4])
    assert slope == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)
    slope, low, high = slope_interval([1.0, 2.0, 3.0, 4.0, 5.0], [0.3, 0.1, 0.4, 0.1, 0.3])
    assert low < 0 < high
    assert all(math.isnan(v) for v in slope_interval([1.0, 2.0], [0.0, 1.0]))
    change, low, high = accuracy_change_interval(0.25, 0.09, 100)
    assert change == pytest.approx(-0.16) and low < high < 0


# The P(Yes) loop measured in this project (issue 26): reward 0.393 -> 0.460 while held-out accuracy 0.25 -> 0.09.
RISING = [(step, 0.39 + 0.0035 * step + 0.01 * (step % 3 == 0)) for step in range(1, 21)]


def validations(*points: tuple[int, float], **extra: list[float]) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) as PeriodicValidation keeps them: accuracy, and other held-out metrics by name."""
    return [
        (step, {"heldout/accuracy": accuracy, **{f"heldout/{k.replace('_', '/')}": v[i] for k, v in extra.items()}})
        for i, (step, accuracy) in enumerate(points)
    ]


def test_the_alarm_fires_when_the_reward_holds_or_rises_while_accuracy_falls_beyond_noise():
    fired = hacking_alarm(RISING, validations((0, 0.25), (10, 0.17), (20, 0.09)), problems=100)
    assert fired and fired.startswith("the training reward rose") and "held-out accuracy fell 0.250 -> 0.090" in fired
    assert hacking_alarm(RISING, validations((0, 0.25), (10, 0.22)), problems=100) is None, "a drop within noise"
    assert hacking_alarm(RISING, validations((0, 0.25)), problems=100) is None, "one validation: no trend"
    flat = [(step, 0.40 + 0.02 * (step % 2)) for step in range(1, 21)]
    held = hacking_alarm(flat, validations((0, 0.25), (20, 0.09)), problems=100)
    assert held and held.startswith("the training reward held"), "a reward that holds while accuracy falls"
    falling = [(step, 0.50 - 0.01 * step) for step in range(1, 21)]
    assert hacking_alarm(falling, validations((0, 0.25), (20, 0.09)), problems=100) is None, "both fell: a collapse"
    assert hacking_alarm(RISING[:2], validations((0, 0.25), (2, 0.05)), problems=100) is None, "2 steps: no trend"


def test_the_alarm_fires_when_a_learned_component_agrees_less_with_the_labels():
    """Accuracy steady at 0.5 of 100 problems; the confidence component's held-out AUROC 0.85 -> 0.55."""
    points = validations((0, 0.5), (10, 0.5), confidence_auroc=[0.85, 0.55])
    fired = hacking_alarm(RISING, points, problems=100, learned=("confidence",))
    assert fired and "confidence agrees less with the verifier's labels: held-out AUROC 0.850 -> 0.550" in fired
    assert hacking_alarm(RISING, points, problems=100) is None, "not a learned component of this mix"
    noise = validations((0, 0.5), (10, 0.5), confidence_auroc=[0.85, 0.78])
    assert hacking_alarm(RISING, noise, problems=100, learned=("confidence",)) is None, "a drop within noise"


def test_the_auroc_standard_error_is_hanley_and_mcneils():
    # A = 0.8, 10 positives, 10 negatives: Q1 = 0.8 / 1.2, Q2 = 1.28 / 1.8;
    # variance = (0.16 + 9 (Q1 - 0.64) + 9 (Q2 - 0.64)) / 100 = (0.16 + 0.24 + 0.64) / 100
    assert auroc_standard_error(0.8, 10, 10) == pytest.approx(math.sqrt(0.0104), rel=1e-3)
    assert math.isnan(auroc_standard_error(0.8, 0, 10))
    change, low, high = auroc_change_interval((0.8, 10, 10), (0.8, 10, 10))
    assert change == 0 and low == pytest.approx(-1.96 * math.sqrt(2 * 0.0104), rel=1e-3) and high == -low


@pytest.mark.parametrize("action", ["warn", "stop"])
def test_the_alarm_is_recorded_once_and_stops_training_when_asked(tmp_path, action):
    """The callback as training calls it, with the P(Yes) loop's numbers: the initial model 0.25 (step 0), then
    0.24, 0.17, 0.09. checkpoint-best stays the initial model's."""
    from transformers import TrainerControl, TrainerState

    accuracies = iter([0.25, 0.24, 0.17, 0.09])
    recorded, logged, saved = [], [], []
    callback = PeriodicValidation(
        Schedule(5, problems=100, alarm=AlarmAction(action)),
        validate=lambda: {"heldout/accuracy": next(accuracies)},
        record=lambda key, value: recorded.append((key, value)),
        log_now=logged.append,
        kept=KeptModels(tmp_path, lambda directory: (saved.append(directory), directory.mkdir(parents=True))),
    )
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(None, state, control)
    assert logged == [{"heldout/accuracy": 0.25}] and len(saved) == 1, "the initial model: logged at step 0, kept"
    for step in (5, 10, 15):
        state.global_step = step
        state.log_history = [{"step": s, "reward": r} for s, r in RISING if s <= step]
        callback.on_step_end(None, state, control)
        if control.should_training_stop:
            break
    assert callback.alarm.startswith("step 15: the training reward rose")
    assert recorded.count(("alarm/reward_hacking", 1.0)) == 1
    assert control.should_training_stop == (action == "stop")
    assert json.loads((tmp_path / "checkpoint-best" / "best.json").read_text())["step"] == 0
    assert len(saved) == 1, "no later validation beat the initial model"


@pytest.mark.e2e
def test_validation_measures_the_learned_components_and_pass_at_k(confidence_run):
    """The confidence component (a frozen generative verifier) scored on the held-out answers at each validation,
    the initial model's included, and pass@k / maj@k from eval.every_samples sampled answers; the last validation
    answers for the evaluation after training (tests/conftest.py's confidence_run: CONFIDENCE_RUN)."""
    run_dir = confidence_run.run_dir
    validated = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl") if "heldout/accuracy" in m}
    assert sorted(validated) == [0, 1, 2]
    for metrics in validated.values():
        assert 0 < metrics["heldout/confidence/mean"] < 1
        assert "heldout/confidence/auroc" in metrics  # NaN -> null: the random model is never right
        assert {"heldout/pass@1", "heldout/pass@2", "heldout/maj@2"} <= set(metrics)
    # the best two validations by the named metric keep their models
    best, second = sorted(validated, key=lambda step: (-validated[step]["heldout/confidence/mean"], step))[:2]
    chosen = json.loads((run_dir / "checkpoint-best" / "best.json").read_text())
    assert chosen["step"] == best and chosen["metric"] == "heldout/confidence/mean"
    assert list((run_dir / "checkpoint-top").iterdir()) == [run_dir / "checkpoint-top" / f"step-{second}"]
    assert list((run_dir / "checkpoint-top" / f"step-{second}").glob("*.safetensors"))
    # the evaluation after training takes the last validation's answers (all 4 held-out problems, the same model)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best_step"] == best and summary["best_metric"] == "heldout/confidence/mean"
    assert [entry["step"] for entry in summary["top_k"]] == [best, second]
    assert summary["heldout_accuracy_after"] == validated[2]["heldout/accuracy"]
    assert len((run_dir / "eval_after.jsonl").read_text().splitlines()) == 4


def test_a_fresh_run_validates_the_initial_model_even_when_another_process_wrote_step_0_already(tmp_path):
    """Under several processes the main process may have logged step 0's validation (metrics.jsonl) before another
    process begins training: that process must not take the file for a resumed run's history, or it keeps other
    checkpoints than the main process and waits in a barrier the others never reach."""
    from transformers import TrainerControl, TrainerState

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "heldout/accuracy": 0.25}) + "\n")
    saved = []
    callback = PeriodicValidation(
        Schedule(5, problems=100),
        validate=lambda: {"heldout/accuracy": 0.25},
        record=lambda key, value: None,
        log_now=lambda metrics: None,
        kept=KeptModels(tmp_path, lambda directory: (saved.append(directory), directory.mkdir(parents=True))),
    )
    callback.on_train_begin(None, TrainerState(), TrainerControl())
    assert callback.kept.kept == [Best(0, 0.25)] and len(saved) == 1


def test_validations_that_measured_nothing_neither_spend_the_patience_nor_crash():
    nan = math.nan
    assert stop_reason([nan, nan, nan], [nan, nan, nan], patience=2, stop_at=None) is None
    assert validations_without_improvement([0.6, nan, nan], [0.05, nan, nan]) == 0
    assert "(best 0.600)" in stop_reason([0.6, nan, 0.55, 0.58], [0.05, nan, 0.05, 0.05], patience=2, stop_at=None)


@pytest.mark.parametrize("every_samples", [0, 2])
def test_the_initial_validation_takes_the_evaluation_befores_greedy_answers(monkeypatch, every_samples):
    """The initial model answered every held-out problem greedily before training: its validation at step 0 scores
    those answers instead of answering again, and draws only the sampled answers (eval.every_samples)."""
    from types import SimpleNamespace

    from datasets import Dataset
    from omegaconf import OmegaConf

    from grpo_exp.run import evaluation
    from grpo_exp.run.heldout import EvalResult

    def answered_again(*args, **kwargs):
        raise AssertionError("the initial model's greedy answers were computed again")

    drawn = []
    monkeypatch.setattr(evaluation, "run_heldout_accuracy", answered_again)
    monkeypatch.setattr(
        evaluation.HeldoutEval,
        "sampled",
        lambda self, model, problems, samples: (
            drawn.append((len(problems), samples)) or SimpleNamespace(metrics={f"pass@{samples}": 0.5})
        ),
    )
    spec = SimpleNamespace(cfg=OmegaConf.create({"eval": {"every_samples": every_samples, "every_problems": 2}}))
    parts = SimpleNamespace(reward_funcs=[], judge=None, p_yes=None)
    heldout = Dataset.from_list([{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(3)])
    held_out_eval = evaluation.HeldoutEval(spec, parts, None, heldout, Path("."), heldout)
    held_out_eval.before = EvalResult(
        accuracy=1 / 3, correct=1, scored=3, samples=[{"correct": c} for c in (False, True, False)]
    )
    metrics = held_out_eval.initial(model=None)
    assert metrics["heldout/accuracy"] == 0.5, "the first eval.every_problems=2 of the answers before training"
    assert drawn == ([(2, 2)] if every_samples else [])
    assert metrics.get("heldout/pass@2") == (0.5 if every_samples else None)
