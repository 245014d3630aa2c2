"""Why a run did (not) learn: each finding's rule driven by hand-made records, the statistics behind them by hand, the
during-training alarms (no signal, answer collapse), the labels check's rule, and `grpo-exp diagnose` on run
directories written by hand (a run made before the findings existed included) and on a real tiny run."""

import json

import pytest

from grpo_exp.analysis.alarms import TURN_CUT, answer_collapse_alarm, no_signal_warning
from grpo_exp.analysis.comparison import comparison_rows, discover_runs
from grpo_exp.analysis.diagnosis import HEALTHY, RunEvidence, diagnose, read_run
from grpo_exp.analysis.diagnosis.rules import (
    answer_collapse,
    entropy,
    format_gain,
    gradient_spikes,
    heldout_fell,
    importance_weights_collapsed,
    labels_misread,
    no_change,
    no_signal,
    no_tool_use,
    reward_not_truth,
    sampler_mismatch,
    sharpened,
    truncated,
    turns_exhausted,
)
from grpo_exp.diagnose import main as diagnose_main
from grpo_exp.measures import paired_change, problems_to_resolve, wilson_interval
from grpo_exp.run.labels_check import answers_alike
from support.config import TINY_RUN
from tests.helpers.cli import run_cli

CONFIG = {
    "trainer": {"num_generations": 4, "prompts_per_step": 2, "learning_rate": 1e-5, "max_steps": 40},
    "verifier": {"labels": "exact_match", "answer": "auto"},
    "dataset": {"source": "reasoning_gym"},
    "rollout": {"demo": None},
}


def sample(question: str, solution: str, completion: str, answer: str | None, correct: bool | None) -> dict:
    return {"question": question, "solution": solution, "completion": completion, "answer": answer, "correct": correct}


def evidence(**fields) -> RunEvidence:
    return RunEvidence(config=CONFIG, **fields)


# ---- the statistics --------------------------------------------------------------------------------------------


def test_the_intervals_behind_the_findings_by_hand():
    low, high = wilson_interval(8, 10)  # Wilson: (0.8 + 1.92/10 -+ 1.96 sqrt(0.016 + 0.00096)) / 1.384
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    assert paired_change([0, 0, 1, 1], [1, 1, 1, 1]) == pytest.approx((0.5, -0.419, 1.419), abs=1e-3)
    assert paired_change([0, 0], [1, 1]) == (1, 1, 1)  # every difference alike: no noise
    # differences [1, 0, 0, 0]: mean 0.25, sd 0.5: (1.96 * 0.5 / 0.25)^2 = 15.4 -> 16 problems
    assert problems_to_resolve([0, 0, 0, 0], [1, 0, 0, 0]) == 16
    assert problems_to_resolve([1, 0], [1, 0]) is None  # no change observed


# ---- the answers and their labels ------------------------------------------------------------------------------


def sentences(count: int, misread: int) -> list[dict]:
    """`misread` answers that state the reference in a sentence, labelled wrong; the rest plainly wrong."""
    rows = []
    for i in range(count):
        if i < misread:
            text = f'The opposite of "w{i}" is "r{i}."'
            rows.append(sample(f"q{i}", f"r{i}", text, text, False))
        else:
            rows.append(sample(f"q{i}", f"r{i}", "I do not know.", "I do not know.", False))
    return rows


def test_labels_that_misread_sentences_are_found_with_three_examples_and_the_rule_that_reads_them():
    found = labels_misread(evidence(summary={"answer": "last_line"}), sentences(20, 12))
    assert found.name == "labels_misread"
    assert found.seen.startswith("12/20 (60%, 95% [0.39, 0.78]) answers state the reference")
    assert found.seen.count("read as") == 3 and "reference 'r0'" in found.seen
    assert found.tries[0].startswith("verifier.answer=phrase   # reads 12 of these 12")
    assert (
        labels_misread(evidence(summary={"answer": "phrase"}), sentences(20, 12))
        .tries[0]
        .startswith("verifier.answer=stated_in_sentence")
    )  # the run's own rule is not offered again
    assert labels_misread(evidence(), sentences(20, 2)) is None  # 2/20: within what the rule may miss
    right = [sample("q", "r", "r", "r", True)] * 20
    assert labels_misread(evidence(), right) is None


def test_every_answer_alike_is_found_by_the_labels_check():
    found = answers_alike([0.01] * 8 + [None], "1*task_score", evidence())
    assert found.seen == "every one of the 8 answers of the untrained policy scored 0.01 by the reward (1*task_score)"
    assert "dataset.levels.enabled=true   # start at the task's easiest level and climb" in found.tries
    assert answers_alike([0.01] * 7 + [1.0], "r", evidence()) is None
    assert answers_alike([0.0] * 4, "r", evidence()) is None  # too few to say


# ---- the learning signal ---------------------------------------------------------------------------------------


def steps(count: int, **metrics) -> list[dict]:
    return [{"reward": metrics.get("reward", 0.0), **metrics} for _ in range(count)]


def test_no_group_with_a_spread_is_found_and_told_apart():
    wrong = no_signal(evidence(steps=steps(10, frac_reward_zero_std=1.0, **{"groups/frac_all_wrong": 1.0})))
    assert wrong.seen.startswith("20/20 (100%, 95% [0.84, 1.00]) groups over 10 steps had no reward spread")
    assert "too hard" in wrong.seen and wrong.tries[0].startswith("dataset.levels.enabled=true")
    assert any(t.startswith("trainer.num_generations=8   # larger groups") for t in wrong.tries)
    paid = steps(10, reward=0.01, frac_reward_zero_std=1.0, **{"groups/frac_all_wrong": 1.0})
    assert "paid the same 0.01: the reward cannot rank them" in no_signal(evidence(steps=paid)).seen
    easy = no_signal(evidence(steps=steps(10, frac_reward_zero_std=1.0, **{"groups/frac_all_correct": 1.0})))
    assert "all right: the task is too easy" in easy.seen and any("curriculum.enabled=true" in t for t in easy.tries)
    assert no_signal(evidence(steps=steps(10, frac_reward_zero_std=0.5))) is None
    assert no_signal(evidence(steps=steps(1, frac_reward_zero_std=1.0))) is None  # 2 groups: too few to say
    assert no_signal(evidence(steps=steps(2, frac_reward_zero_std=1.0))) is not None  # 4 of 4: not one spread


def test_no_signal_and_answer_collapse_alarms_by_hand():
    assert no_signal_warning([1.0, 1.0], window=2).startswith(
        "not one group had a reward spread in any of the 2 logged"
    )
    assert (
        no_signal_warning([0.5, 1.0, 1.0], window=2) is None
    )  # a healthy run's groups are often all wrong for a while
    assert no_signal_warning([0.5] + [1.0] * 6, window=2).startswith(
        "not one group had a reward spread in any of the last 6"
    )
    assert no_signal_warning([1.0, 0.5], window=2) is None
    assert no_signal_warning([1.0], window=2) is None
    # 40 answers all 'yes', references 70% yes: Wilson low 0.912 above 0.6 and above 0.7
    found = answer_collapse_alarm(["yes"] * 40, ["yes"] * 28 + ["no"] * 12, 0.6)
    assert "40 of 40 recent completions answer 'yes' (95% interval from 0.91" in found and "70%" in found
    assert answer_collapse_alarm(["yes"] * 28 + ["no"] * 12, ["yes"] * 28 + ["no"] * 12, 0.6) is None  # right
    assert answer_collapse_alarm(["7"] * 40, ["7"] * 40, 0.6) is None  # one reference: nothing to tell apart


def test_a_collapse_to_a_constant_answer_names_it_per_task():
    after = [sample(f"q{i}", "Yes" if i < 7 else "No", "Yes", "Yes", i < 7) for i in range(10)]
    after = [s | {"task_name": "syllogism"} for s in after]
    found = answer_collapse(evidence(after=after, steps=steps(3, **{"diversity/distinct_answers": 0.25})))
    assert found.seen.startswith("syllogism: 10/10 (100%, 95% [0.72, 1.00]) held-out answers are 'yes'")
    assert "reference of 70% of them" in found.seen
    varied = [sample(f"q{i}", "Yes" if i % 2 else "No", "x", "Yes" if i % 2 else "No", True) for i in range(10)]
    assert answer_collapse(evidence(after=varied)) is None


# ---- the held-out result ---------------------------------------------------------------------------------------


def paired_runs(before: list[tuple[bool, str]], after: list[tuple[bool, str]]) -> tuple[list[dict], list[dict]]:
    """(label, completion) per problem; the reference of problem i is 'r'."""
    return tuple(
        [sample(f"q{i}", "r", text, text, label) for i, (label, text) in enumerate(rows)] for rows in (before, after)
    )


def test_a_gain_in_format_only_is_told_from_a_gain_in_content():
    before, after = paired_runs([(False, "It is r.")] * 20, [(True, "r")] * 20)  # right in content all along
    found = format_gain(evidence(before=before, after=after))
    assert found.seen.startswith("held-out accuracy 0.000 -> 1.000 (+1.000, paired 95% [+1.000, +1.000], 20 problems)")
    assert "content check went 1.000 -> 1.000 (+0.000" in found.seen
    before, after = paired_runs([(False, "I do not know.")] * 20, [(True, "r")] * 20)
    assert format_gain(evidence(before=before, after=after)) is None  # content too
    # games won (GuessTheNumber after a warm-up, 23 -> 68 of 100): an environment's episodes have no reference
    games, won = paired_runs([(False, "<move>[10]</move>")] * 20, [(True, "<move>[13]</move>")] * 20)
    assert format_gain(RunEvidence(config=multiturn("textarena/GuessTheNumber-v0"), before=games, after=won)) is None


def test_no_measurable_change_says_how_many_problems_would_show_it_and_a_flat_reward_says_too_slow():
    before, after = paired_runs([(False, "x")] * 20, [(True, "r")] * 2 + [(False, "x")] * 18)
    flat = [{"reward": 0.1 + 0.01 * (i % 2)} for i in range(20)]
    found = no_change(evidence(before=before, after=after, steps=flat))
    assert "0.000 -> 0.100 (+0.100, paired 95% [-0.044, +0.244], 20 problems)" in found.seen
    assert "would need about 37 problems" in found.seen  # sd 0.3078: (1.96 * 0.3078 / 0.1)^2 = 36.4
    assert found.tries[:2] == ("trainer.learning_rate=3e-05", "trainer.max_steps=80")
    # a rate far below the default: advice starts from the default, not from 3x the rate that failed
    config = {**CONFIG, "trainer": {**CONFIG["trainer"], "learning_rate": 1e-9}}
    advice = no_change(RunEvidence(config=config, before=before, after=after, steps=flat)).tries[0]
    assert advice.startswith("trainer.learning_rate=1e-05   # the default") and "10,000x below" in advice, advice
    rising = [{"reward": 0.01 * i} for i in range(20)]
    assert no_change(evidence(before=before, after=after, steps=rising)).tries == ("dataset.eval_size=37",)
    gained = paired_runs([(False, "x")] * 20, [(True, "r")] * 20)
    assert no_change(evidence(before=gained[0], after=gained[1])) is None


def test_a_rising_reward_with_a_falling_held_out_measure_suspects_the_reward():
    before, after = paired_runs([(True, "r")] * 12 + [(False, "x")] * 8, [(False, "x")] * 20)
    rising = [{"reward": 0.02 * i} for i in range(20)]
    found = reward_not_truth(evidence(before=before, after=after, steps=rising, probe=["math: 'echo' pays ..."]))
    assert found.seen.startswith("the training reward rose 0.040 -> 0.340")
    assert "held-out went 0.600 -> 0.000" in found.seen and "the reward probe found: math: 'echo'" in found.seen
    assert reward_not_truth(evidence(before=after, after=before, steps=rising)) is None  # held-out rose too
    episodes = [s | {"environment": "Guess", "env_success": s["correct"]} for s in before]
    found = reward_not_truth(evidence(before=episodes, after=after, steps=rising))
    assert "probe.before_training=warn" in found.tries[0] and "pays=success" in found.tries[-1]


def test_samples_grown_greedier_are_told_from_a_reward_to_suspect():
    """The TextArena win-only run's shape: sampled wins rose to the untrained greedy rate while the entropy fell and
    greedy wins stayed where they were: sharpened, not reward_not_truth."""
    before, after = paired_runs([(True, "r")] * 7 + [(False, "x")] * 13, [(True, "r")] * 7 + [(False, "x")] * 13)
    greedier = [{"reward": 0.05 + 0.01 * i, "entropy": 1.6 - 0.07 * i} for i in range(20)]  # 0.05 -> 0.24; < 0.35
    found = sharpened(evidence(before=before, after=after, steps=greedier))
    assert found.seen.startswith("the training reward rose 0.070 -> 0.220")
    assert "greedy held-out 0.350" in found.seen and "entropy fell 1.46 -> 0.41" in found.seen
    assert reward_not_truth(evidence(before=before, after=after, steps=greedier)) is None
    beyond = [step | {"reward": step["reward"] + 0.5} for step in greedier]  # above what greedy scored (its interval)
    assert sharpened(evidence(before=before, after=after, steps=beyond)) is None
    assert reward_not_truth(evidence(before=before, after=after, steps=beyond)) is not None
    spread = [step | {"entropy": 1.6} for step in greedier]  # the entropy held
    assert sharpened(evidence(before=before, after=after, steps=spread)) is None


# ---- the policy's health ---------------------------------------------------------------------------------------


def test_truncation_entropy_and_gradient_spikes():
    cut = evidence(steps=steps(5, **{"completions/clipped_ratio": 1.0}))
    cut.config = CONFIG | {"trainer": CONFIG["trainer"] | {"max_completion_length": 64}}
    assert truncated(cut).tries == ("trainer.max_completion_length=128",)
    collapsed = evidence(steps=[{"reward": 0.0, "entropy": e} for e in [2.0] * 5 + [0.1] * 5])
    assert "collapsed" in entropy(collapsed).seen and "trainer.temperature=1.2" in entropy(collapsed).tries
    spiky = evidence(steps=[{"reward": 0.0, "grad_norm": n} for n in [1.0] * 9 + [50.0]])
    assert gradient_spikes(spiky).seen.startswith("1 of 10 steps had a gradient norm above 10x the median 1")
    assert truncated(evidence(steps=steps(5))) is None and gradient_spikes(evidence(steps=steps(9))) is None
    # a multi-turn run is read from its own share of last turns cut, not from TRL's (which counts a game's last move)
    games = evidence(steps=steps(5, **{"completions/clipped_ratio": 1.0, "rollout/cut_frac": 0.0}))
    assert truncated(games) is None
    turns_cut = evidence(steps=steps(5, **{"completions/clipped_ratio": 0.0, "rollout/cut_frac": 1.0}))
    turns_cut.config = CONFIG | {"rollout": {"max_tokens_per_turn": 24}}
    assert "were cut at rollout.max_tokens_per_turn" in truncated(turns_cut).seen
    assert truncated(turns_cut).tries == ("rollout.max_tokens_per_turn=48",)


# ---- grpo-exp diagnose ---------------------------------------------------------------------------------------------


def write_run(directory, metrics: list[dict], summary: dict | None = None, before=(), after=()) -> None:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    lines = [{"step": step, **m} for step, m in enumerate(metrics, 1)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    if summary is not None:
        (directory / "summary.json").write_text(json.dumps(summary))
    for name, rows in (("eval_before.jsonl", before), ("eval_after.jsonl", after)):
        if rows:
            (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_diagnose_reads_any_run_directory_an_older_one_included(tmp_path, capsys):
    flat = steps(10, frac_reward_zero_std=1.0, **{"groups/frac_all_wrong": 1.0})
    write_run(tmp_path / "sweep" / "0", flat, summary={"steps": 10})  # no eval files, no diagnosis: an older run
    before, after = paired_runs([(True, "r")] * 10 + [(False, "x")] * 10, [(True, "r")] * 20)
    write_run(tmp_path / "sweep" / "1", [{"reward": 0.05 * i} for i in range(20)], before=before, after=after)
    assert diagnose_main([str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert "sweep/0:\n  no_signal: 20/20 (100%" in out and "  try: trainer.num_generations=8" in out
    assert f"sweep/1:\n  {HEALTHY}" in out
    assert diagnose_main([str(tmp_path / "sweep" / "0"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(tmp_path / "sweep" / "0")][0]["name"] == "no_signal"
    assert [f.name for f in diagnose(read_run(tmp_path / "sweep" / "1"))] == []
    rows = comparison_rows(discover_runs([tmp_path / "sweep"]), [])  # grpo-exp compare: each run's findings
    assert [row["findings"] for row in rows] == ["no_signal", "none"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("missing", "missing: no such directory"),
        ("notes.txt", "notes.txt: not a directory"),
        ("empty", "no grpo_exp run"),
    ],
)
def test_diagnose_refuses_what_is_no_run_in_one_line(tmp_path, capsys, path, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a run")
    with pytest.raises(SystemExit) as stop:
        diagnose_main([str(tmp_path / path)])
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.e2e
def test_a_run_without_a_single_spread_warns_during_training_and_is_diagnosed(tmp_path):
    """The tiny random model on a word task labelled by exact_match: every answer wrong, every group without spread.
    The labels check says every answer scores alike before the first step, the no-signal warning fires at step 2,
    and the summary's diagnosis and `grpo-exp diagnose` say no_signal."""
    data = tmp_path / "words.jsonl"
    data.write_text("".join(json.dumps({"question": f"Say w{i}.", "answer": f"w{i}"}) + "\n" for i in range(40)))
    overrides = [o for o in TINY_RUN if not o.startswith("dataset.")]
    result = run_cli(
        *overrides,
        "logger=none",
        "dataset=files",
        f"dataset.path={data}",
        "dataset.eval_size=8",
        "reward=correct",
        "verifier.labels=exact_match",
        "trainer.max_steps=3",
        "health.window=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["labels_check"][0].startswith("answers_alike: every one of the 8 answers of the untrained policy")
    assert summary["no_signal_warning"].startswith("step 2: not one group had a reward spread in any of the 2 logged")
    assert [f["name"] for f in summary["diagnosis"]][:1] == ["no_signal"]
    console = result.stdout + result.stderr
    assert "No learning signal at step 2" in console and "diagnosis" in console
    listed = run_cli(str(tmp_path / "run"), module="grpo_exp.diagnose")
    assert listed.returncode == 0 and "\n  no_signal: " in listed.stdout


def test_no_change_is_left_out_where_another_finding_accounts_for_the_held_out_result():
    before, after = paired_runs([(False, "x")] * 20, [(False, "x")] * 20)
    flat = steps(10, frac_reward_zero_std=1.0, **{"groups/frac_all_wrong": 1.0})
    assert [f.name for f in diagnose(evidence(before=before, after=after, steps=flat))] == ["no_signal"]
    quiet = [{"reward": 0.1, "grad_norm": 1.0} for _ in range(10)]
    found = diagnose(evidence(before=before, after=after, steps=quiet))
    assert [f.name for f in found] == ["no_change"] and "learning may be too slow" in found[0].why


def test_the_health_callback_sounds_the_answer_collapse_and_stops_when_told(tmp_path):
    """PolicyHealth fed as the trainer feeds it: each step's answers (observe_answers), then the step's logs."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from grpo_exp.run.health import PolicyHealth
    from grpo_exp.schema import HealthSchema

    cfg = OmegaConf.merge(OmegaConf.structured(HealthSchema), {"window": 3, "answer_collapse": "stop"})
    health = PolicyHealth(cfg, completions_per_step=8, metrics_file=tmp_path / "metrics.jsonl")
    control = SimpleNamespace(should_training_stop=False)
    for step in range(1, 4):
        health.observe_answers(["yes"] * 8, ["yes"] * 4 + ["no"] * 4)
        logs = {"entropy": 1.0, "frac_reward_zero_std": 0.5}
        health.on_log(None, SimpleNamespace(global_step=step), control, logs=logs)
    assert logs["alarm/answer_collapse"] == 1.0 and control.should_training_stop
    assert health.summary()["answer_collapse_alarm"].startswith("step 3: the policy collapsed to one answer: 24 of 24")
    assert health.summary()["health_stopped"].endswith("(health.answer_collapse=stop)")
    assert health.summary()["no_signal_warning"] is None  # half the groups had a spread


def test_the_health_callback_reads_a_multi_turn_runs_own_cut_share(tmp_path):
    """A game ends on a move, without an EOS: TRL counts every such trajectory as clipped. The truncation warning
    reads rollout/cut_frac where the run logs it, and names the setting that cut."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from grpo_exp.run.health import PolicyHealth
    from grpo_exp.schema import HealthSchema

    cfg = OmegaConf.merge(OmegaConf.structured(HealthSchema), {"window": 3})
    for cut, fires in ((0.0, False), (1.0, True)):
        health = PolicyHealth(cfg, completions_per_step=8, metrics_file=tmp_path / "metrics.jsonl")
        for step in range(1, 4):
            logs = {"entropy": 1.0, "frac_reward_zero_std": 0.5, "completions/clipped_ratio": 1.0}
            health.on_log(None, SimpleNamespace(global_step=step), SimpleNamespace(), logs=logs | {TURN_CUT: cut})
        warning = health.summary()["truncation_warning"]
        assert (warning is not None) == fires and (not fires or "cut at rollout.max_tokens_per_turn" in warning)


def test_a_sampler_far_from_the_trainer_is_found():
    measured = [
        {"reward": 0.0, "sampling/sampling_logp_difference/mean": d, "sampling/importance_sampling_ratio/min": 0.7,
         "sampling/importance_sampling_ratio/max": 1.3}
        for d in (0.03, 0.04, 0.05)
    ]  # fmt: skip
    found = sampler_mismatch(evidence(steps=measured))
    assert found.seen.startswith(
        "the sampler's log-probabilities are 0.040 a token from the trainer's on average over 3"
    )
    assert "ratio 0.70 to 1.30" in found.seen and found.tries[0].startswith("generation=transformers_fast")
    float32 = [{"reward": 0.0, "sampling/sampling_logp_difference/mean": 1e-5} for _ in range(3)]
    assert sampler_mismatch(evidence(steps=float32)) is None


def test_a_setting_the_run_already_has_is_not_offered_again():
    after = [sample(f"q{i}", "Yes" if i < 7 else "No", "Yes", "Yes", i < 7) for i in range(10)]
    run = evidence(after=after)
    assert diagnose(run)[0].tries[0].startswith("health.answer_collapse=stop")
    run.config = CONFIG | {"health": {"answer_collapse": "stop"}}
    (found,) = diagnose(run)
    assert found.name == "answer_collapse" and not any(t.startswith("health.answer_collapse") for t in found.tries)


def test_a_held_out_fall_without_a_rising_reward_is_found():
    before, after = paired_runs([(True, "r")] * 12 + [(False, "x")] * 8, [(False, "x")] * 20)
    flat = [{"reward": 0.1 + 0.01 * (i % 2)} for i in range(20)]
    found = heldout_fell(evidence(before=before, after=after, steps=flat))
    assert found.seen.startswith("held-out went 0.600 -> 0.000 (-0.600")
    assert found.tries[0].startswith("eval.every=5")
    rising = [{"reward": 0.02 * i} for i in range(20)]
    assert heldout_fell(evidence(before=before, after=after, steps=rising)) is None  # reward_not_truth's case


def test_diagnose_says_which_run_it_cannot_read_in_one_line_and_goes_on(tmp_path, capsys):
    write_run(tmp_path / "runs" / "good", steps(3))
    write_run(tmp_path / "runs" / "bad", steps(3))
    (tmp_path / "runs" / "bad" / "config.yaml").write_text("a: [")
    assert diagnose_main([str(tmp_path / "runs")]) == 1
    captured = capsys.readouterr()
    config = tmp_path / "runs" / "bad" / "config.yaml"
    assert f"bad: cannot read its records: {config}: not YAML (while parsing a flow node" in captured.err
    assert "Traceback" not in captured.err and f"good:\n  {HEALTHY}" in captured.out


def test_a_run_stopped_while_writing_a_line_is_diagnosed_from_the_lines_before_it(tmp_path, capsys):
    flat = steps(10, frac_reward_zero_std=1.0, **{"groups/frac_all_wrong": 1.0})
    write_run(tmp_path / "cut", flat)
    with (tmp_path / "cut" / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"step": 11, "frac_reward_zero')  # killed mid-line: out of time, memory or disk
    assert diagnose_main([str(tmp_path / "cut")]) == 0
    assert "no_signal: 20/20 (100%" in capsys.readouterr().out  # ten whole steps, the cut one left out
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "cut" / "metrics.jsonl").write_text("\n".join([*lines[:3], "[1, 2]", *lines[3:]]))
    assert diagnose_main([str(tmp_path / "cut")]) == 1
    assert f"{tmp_path / 'cut' / 'metrics.jsonl'}: line 4 is not a JSON object" in capsys.readouterr().err


# ---- multi-turn rollouts and environments ----------------------------------------------------------------------


def multiturn(environment: str | None = None, max_turns: int = 4) -> dict:
    return {**CONFIG, "rollout": {"demo": None, "environment": environment, "max_turns": max_turns}}


def test_a_policy_that_never_acts_is_told_to_see_a_demonstration():
    idle = [{"rollout/used_tool_frac": 0.0, "reward": 0.0} for _ in range(8)]
    found = no_tool_use(RunEvidence(config=multiturn("textarena/Mastermind-v0"), steps=idle))
    assert found.seen == "the policy never made a move: rollout/used_tool_frac was 0 in all 8 logged steps"
    assert found.tries[0].startswith("rollout.demo=") and "textarena_guess" in found.tries[0]
    assert "called a tool" in no_tool_use(RunEvidence(config=multiturn(), steps=idle)).seen
    once = idle[:7] + [{"rollout/used_tool_frac": 0.125}]
    assert no_tool_use(RunEvidence(config=multiturn(), steps=once)) is None


def test_groups_without_spread_from_a_policy_that_never_acts_are_not_called_too_hard():
    """The Mastermind run of issue 55, set up without a demonstration: every group all wrong because the policy never
    made a move. The advice is the demonstration, not an easier prompt."""
    idle = [
        {"rollout/used_tool_frac": 0.0, "reward": 0.0, "frac_reward_zero_std": 1.0, "groups/frac_all_wrong": 1.0}
        for _ in range(8)
    ]
    found = no_signal(RunEvidence(config=multiturn("textarena/Mastermind-v0"), steps=idle))
    assert "never made a move" in found.seen and "too hard" not in found.seen
    assert found.tries[0].startswith("rollout.demo=") and not any("prompt.system" in t for t in found.tries)


def test_a_game_never_acted_in_or_never_won_is_told_to_warm_up_on_a_players_episodes_unless_it_did():
    """warmup=sft: the environment's own expert where grpo_exp has one (GuessTheNumber), else the user's; a run that
    had a warm-up is not told again."""
    idle = [{"rollout/used_tool_frac": 0.0, "reward": 0.0} for _ in range(8)]
    found = no_tool_use(RunEvidence(config=multiturn("textarena/Mastermind-v0"), steps=idle))
    assert "warmup=sft warmup.source=expert warmup.expert=<module:function that plays>" in found.tries[1]
    lost = [
        {"rollout/used_tool_frac": 1.0, "reward": 0.0, "frac_reward_zero_std": 1.0, "groups/frac_all_wrong": 1.0}
        for _ in range(8)
    ]
    guess = multiturn("textarena/GuessTheNumber-v0")
    found = no_signal(RunEvidence(config=guess, steps=lost))
    assert "too hard" in found.seen and found.tries[0].startswith(
        "warmup=sft warmup.source=expert warmup.expert=grpo_exp.environments.textarena:guess_the_number_expert"
    )
    warmed = {**guess, "warmup": {"source": "expert"}}
    assert not any("warmup=" in t for t in no_signal(RunEvidence(config=warmed, steps=lost)).tries)
    single = {**CONFIG, "rollout": {"name": "single"}}
    assert not any("warmup=" in t for t in no_signal(RunEvidence(config=single, steps=lost)).tries)


def test_an_environments_held_out_episodes_are_not_read_as_collapsed_answers():
    """An environment scores its episodes: the last message of every game ('5') is no answer to a reference."""
    games = [sample(f"game {i}", str(i % 7), "5", "5", False) for i in range(30)]
    assert answer_collapse(RunEvidence(config=multiturn("textarena/Mastermind-v0"), after=games)) is None
    assert answer_collapse(RunEvidence(config=multiturn(), after=games)) is not None  # answers to references: read


def test_trajectories_that_run_out_of_turns_are_told_to_get_more():
    spent = [{"rollout/turns_mean": 3.9, "rollout/final_answer_frac": 0.2} for _ in range(8)]
    found = turns_exhausted(RunEvidence(config=multiturn(max_turns=4), steps=spent))
    assert "3.9 of rollout.max_turns=4" in found.seen and "20% ended with a final answer" in found.seen
    assert found.tries[0] == "rollout.max_turns=8"
    answered = [{"rollout/turns_mean": 3.9, "rollout/final_answer_frac": 0.8} for _ in range(8)]
    assert turns_exhausted(RunEvidence(config=multiturn(max_turns=4), steps=answered)) is None
    assert turns_exhausted(RunEvidence(config=multiturn("textarena/Mastermind-v0"), steps=spent)) is None


def test_importance_weights_whose_effective_sample_size_collapsed_are_found_with_a_smaller_lag_and_rate():
    """Generation ahead's batches far off-policy: the weights' effective sample size a small share of the batch."""
    ess, clipped = "sampling/importance_sampling_ess_fraction", "sampling/importance_sampling_clipped_fraction"
    far = [{"reward": 0.1, ess: e, clipped: 0.3} for e in (0.9, 0.6, 0.3, 0.2, 0.25, 0.35)]
    run = evidence(steps=far)
    run.config = CONFIG | {"trainer": CONFIG["trainer"] | {"max_staleness": 2}}
    found = importance_weights_collapsed(run)
    assert found.seen.startswith("the importance weights' effective sample size was 0.27 of the batch on average over")
    assert found.seen.endswith("the last 3 of 6 steps (lowest 0.20); 30% truncated or masked")
    assert found.tries[0].startswith("trainer.max_staleness=1") and found.tries[1].startswith("trainer.learning_rate=")
    near = [{"reward": 0.1, ess: 0.97} for _ in range(6)]
    assert importance_weights_collapsed(evidence(steps=near)) is None
    assert importance_weights_collapsed(evidence(steps=far[:2])) is None  # too few steps to say
    synchronous = importance_weights_collapsed(evidence(steps=far))  # no lag to shorten: the learning rate only
    assert not any(t.startswith("trainer.max_staleness") for t in synchronous.tries)
