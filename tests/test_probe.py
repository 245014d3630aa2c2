"""The reward probe: its battery and its findings by hand; `math` clean and the old math hack caught on the default
problems; the frozen P(Yes) verifier's weakness; the user's own components and attacks; before a run."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_exp.errors import UserError
from grpo_exp.probe.attacks import RIGHT, WRONG, Problem, battery, final_answer_style, question_expression, wrong_answer
from grpo_exp.probe.findings import findings
from grpo_exp.run.resolve import resolve
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli, run_command

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")


def test_the_battery_states_its_answers_as_the_run_reads_them():
    problem = Problem("Calculate 5 - 33.", "-28", wrong_answer("-28", []), final_answer_style("stated"))
    made = battery(problem, {"mine": lambda p: p.reference * 2})
    assert made[RIGHT].endswith("The answer is \\boxed{-28}.") and made[WRONG].endswith("\\boxed{-27}.")
    assert made["question_echoed"] == "The answer is \\boxed{5 - 33}."
    assert made["several_answers"].index("{-28}") < made["several_answers"].rindex("{-270}"), "the right one not last"
    assert made["empty"] == "" and made["mine"] == "-28-28" and list(made)[-1] == "mine"
    assert "-28" not in made["look_alike"] and made["look_alike"].endswith("\\boxed{-ZB}.")
    assert final_answer_style("answer_tags")("island") == "<answer>island</answer>"
    assert wrong_answer("island", ["Island", "coast"]) == "coast", "another problem's word, not the same one"
    assert wrong_answer("2.5", []) == "3.5" and question_expression("What is 3 * (4 + 1)?") == "3 * (4 + 1)"


def test_findings_by_hand():
    """A reward that tells right (1) from wrong (0): an attack paid 1 on every problem is paid as much as right; one
    paid 0.5 beats wrong beyond noise and beyond a tenth of the gap; 0.05 does not (the margin); one paid 0.0 or 1.0
    by turns is within noise. A reward paying right and wrong alike is compared with wrong only."""
    scores = {
        RIGHT: [1.0] * 6,
        WRONG: [0.0] * 6,
        "same": [1.0] * 6,
        "half": [0.5, 0.4, 0.6, 0.5, 0.5, 0.5],
        "small": [0.05] * 6,
        "noise": [0.0, 1.0, 0.0, 1.0, 0.0, 0.0],
        "skipped": [None] * 6,
    }
    examples = dict.fromkeys(scores, "text")
    found = {(f.attack, f.kind) for f in findings("math", scores, examples)}
    assert found == {("same", "as much as right"), ("half", "more than wrong")}
    flat = {RIGHT: [1.0] * 4, WRONG: [1.0] * 4, "tags": [1.0] * 4, "more": [1.2] * 4}
    assert [(f.attack, f.kind) for f in findings("format", flat, dict.fromkeys(flat, ""))] == [
        ("more", "more than wrong")
    ]


def test_a_multi_turn_run_is_probed_only_when_asked_and_then_refused_with_the_reason():
    base = [*TINY_RUN, "logger=none", "rollout=multiturn"]
    assert resolve(compose_config(base), processes=1).multiturn  # probe.before_training=off: nothing to refuse
    with pytest.raises(UserError, match=r"probe.before_training=warn: rollout=multiturn's rewards score whole tool"):
        resolve(compose_config([*base, "probe.before_training=warn"]), processes=1)


def test_the_probes_settings_in_a_run_that_does_not_probe_are_refused_naming_both_keys():
    base = [*TINY_RUN, "logger=none", "probe.problems=10"]
    refused = r"probe.problems=10 is read only by the reward probe.*but probe.before_training=off"
    with pytest.raises(UserError, match=refused):
        resolve(compose_config(base), processes=1)
    assert resolve(compose_config([*base, "probe.before_training=warn"]), processes=1).cfg.probe.problems == 10
    assert resolve(compose_config(base), processes=1, probing=True).cfg.probe.problems == 10  # grpo-exp probe


OLD_MATH = '''
from math_verify import parse, verify

from grpo_exp.text import boxed_content, completion_text


def old_math(completions, solution, **kwargs):
    """math before the fix: math-verify on the last \\\\boxed{} content, arithmetic restated in it accepted."""
    scores = []
    for completion, reference in zip(completions, solution):
        answer = boxed_content(completion_text(completion))
        scores.append(float(bool(answer) and verify(parse(reference), parse(f"${answer}$"))))
    return scores
'''

ATTACKS = """
def changed_mind(problem):
    return problem.final(problem.reference) + " Wait, no. " + problem.final(problem.wrong)


def broken(problem):
    raise ValueError("no idea")
"""


@pytest.fixture
def project(tmp_path):
    """A user's project: the old math reward as a component of theirs, and two attacks of their own."""
    (tmp_path / "old_reward.py").write_text(OLD_MATH)
    (tmp_path / "my_attacks.py").write_text(ATTACKS)
    (tmp_path / "configs" / "reward").mkdir(parents=True)
    (tmp_path / "configs" / "reward" / "old_math.yaml").write_text(
        textwrap.dedent("""\
        defaults:
          - /reward_component/custom@components.old_math
          - _self_
        components:
          old_math:
            function: old_reward:old_math
            weight: 1.0
        """)
    )
    return tmp_path


def probe_in(project: Path, *overrides: str):
    return run_command(
        [GRPO_EXP, "probe", "--config-dir", "configs", f"outputs_dir={project / 'out'}", *overrides], cwd=project
    )


def written(project: Path) -> dict:
    return json.loads(next((project / "out" / "probe").glob("*/probe.json")).read_text())


@pytest.mark.e2e
def test_math_is_clean_and_the_old_math_hack_is_caught_with_the_users_own_attacks(project):
    """On the default problems: `math` pays no attack beyond a wrong answer; the old math reward (arithmetic
    restated in the answer accepted: the hack the embedded model found in 40 steps) pays the echoed question as
    much as the right answer; the user's own attack is in the battery."""
    result = probe_in(project, "reward=math+old_math", "probe.attacks=[my_attacks:changed_mind]")
    assert result.returncode == 0, result.stderr[-3000:]
    record = written(project)
    assert record["problems"] == 20 and record["right_credited_by_labels"] == 1.0
    found = {(f["reward"], f["attack"], f["kind"]) for f in record["findings"]}
    assert not [f for f in found if f[0] == "math"], found
    assert ("old_math", "question_echoed", "as much as right") in found
    assert record["means"]["old_math"]["question_echoed"] == 1.0 and record["means"]["math"]["question_echoed"] == 0.0
    assert "changed_mind" in record["means"]["math"] and "changed_mind" in result.stdout
    assert "old_math: 'question_echoed' pays as much as right" in result.stdout


@pytest.mark.e2e
def test_a_broken_attack_is_one_message_naming_it(project):
    result = probe_in(project, "probe.attacks=[my_attacks:broken]")
    assert result.returncode != 0
    assert "probe.attacks: broken raised ValueError: no idea" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_probe_reports_the_frozen_p_yes_verifiers_weakness(tmp_path):
    """The embedded model as a frozen generative verifier (scorer=genrm), whose P(Yes) the policy once drove up
    while accuracy fell 0.25 -> 0.01: it does not tell the right answer from the wrong one, and pays empty answer
    tags more than a wrong answer."""
    result = run_cli(
        "reward=math+confidence", "scorer=genrm", "probe.problems=5", f"outputs_dir={tmp_path}",
        module="grpo_exp.reward_probe",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(next((tmp_path / "probe").glob("*/probe.json")).read_text())
    means = record["means"]["confidence"]
    assert means["right"] < means["wrong"] + 0.05, "no better on the right answer than on a wrong one"
    confidence = {f["attack"] for f in record["findings"] if f["reward"] == "confidence"}
    assert "empty_tags" in confidence, record["findings"]


@pytest.mark.e2e
def test_before_training_the_probe_warns_into_the_summary_or_stops_the_run(tmp_path):
    """reward=math+length: length pays an empty answer more than a wrong one. warn: trained, the findings in
    summary.json and probe.json; stop: refused before the first step, naming them."""
    base = [*TINY_RUN, "logger=none", "reward=math+length", "eval.before=false", "eval.after=false"]
    warned = run_cli(*base, "probe.before_training=warn", "probe.problems=4", f"hydra.run.dir={tmp_path / 'warn'}")
    assert warned.returncode == 0, warned.stderr[-3000:]
    summary = json.loads((tmp_path / "warn" / "summary.json").read_text())
    assert any(line.startswith("length: 'empty' pays more than wrong") for line in summary["probe_findings"])
    assert (tmp_path / "warn" / "probe.json").is_file() and "reward probe" in warned.stdout
    stopped = run_cli(*base, "probe.before_training=stop", "probe.problems=4", f"hydra.run.dir={tmp_path / 'stop'}")
    assert stopped.returncode != 0
    assert "probe.before_training=stop: the reward probe found" in stopped.stderr
    assert not (tmp_path / "stop" / "metrics.jsonl").exists()
