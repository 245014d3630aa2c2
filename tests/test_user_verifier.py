"""The run's correctness labels (`verifier.labels`): the built-in exact_match, the user's own function by import path,
the `correct` reward that trains on them, and a dataset function (`dataset=function`), as a user meets them.

One end-to-end run, from a project directory of the user's own: rows from their function, labels from their
function, `reward=correct`; held-out accuracy, the group statistics and the reward all follow those labels, and
`grpo-exp evaluate <run dir>` re-composes the run (its config directory) and labels with the same function."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from grpo_exp.errors import UserError
from grpo_exp.rewards.registry import build_rewards, typed_components
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import latest_evaluation
from grpo_exp.schema import VerifierSchema
from grpo_exp.text import stated_answer
from grpo_exp.verification.benchmark import benchmark_key
from grpo_exp.verification.labels import build_labels, exact_match, normalise_answer, user_verifier
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_command
from tests.helpers.resolve_cases import resolve_cases

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")


# ---- the built-in exact_match ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion,solution,expected",
    [
        ("The capital is \\boxed{Paris}.", "Paris", True),
        ("\\boxed{ paris }", "PARIS", True),
        ("\\boxed{\\text{Paris}}", "Paris.", True),
        ("I think \\boxed{New   York}", "new york", True),
        ("\\boxed{Lyon}", "Paris", False),
        ("no stated answer at all", "Paris", False),  # no \boxed{}, no number: wrong, not unjudged
        ("so it is 42", "42", True),  # the last number is the stated answer
        ("\\boxed{0.5}", "1/2", False),  # exact, not mathematical: math_verify would say True
        ("\\boxed{anything}", "  ", None),  # an empty reference cannot be judged
    ],
)
def test_exact_match_compares_the_stated_answer_normalised(completion, solution, expected):
    assert exact_match(completion, solution, stated_answer) is expected


def test_normalise_answer():
    assert normalise_answer(" $\\textbf{Blue}$. ") == "blue"
    assert normalise_answer("'A'") == "a"


def verifier_cfg(**values):
    return OmegaConf.merge(OmegaConf.structured(VerifierSchema), values)


def test_the_built_in_labellers_leave_answers_without_a_reference_unjudged():
    texts, solutions = ["\\boxed{4}", "\\boxed{four}", "\\boxed{4}"], ["4", "four", None]
    assert build_labels(verifier_cfg(), ["4"])(texts, solutions) == [True, None, None]  # math-verify cannot read 'four'
    assert build_labels(verifier_cfg(labels="exact_match"), ["4"])(texts, solutions) == [True, True, None]


# ---- the user's function: its results checked -----------------------------------------------------------------


def test_a_user_function_is_called_per_answer_with_a_reference():
    calls = []

    def label(completion, solution):
        calls.append((completion, solution))
        return None if solution == "?" else np.bool_(completion == solution)  # a NumPy bool is a bool

    verify = user_verifier(label, "mine:label", batched=False)
    assert verify(["a", "b", "c", "d"], ["a", "x", None, "?"]) == [True, False, None, None]
    assert calls == [("a", "a"), ("b", "x"), ("d", "?")]  # no reference: not asked


def test_a_batched_user_function_is_called_once():
    calls = []

    def labels(completions, solutions):
        calls.append((completions, solutions))
        return [c == s for c, s in zip(completions, solutions, strict=True)]

    verify = user_verifier(labels, "mine:labels", batched=True)
    assert verify(["a", "b", "c"], ["a", None, "x"]) == [True, None, False]
    assert calls == [(["a", "c"], ["a", "x"])]
    assert verify(["a"], [None]) == [None] and len(calls) == 1  # nothing to judge: not called


@pytest.mark.parametrize(
    "func,batched,message",
    [
        (
            lambda c, s: 1.0,
            False,
            "verifier.labels=mine:f returned 1.0 (float) for completion 0: labels are True, False",
        ),
        (lambda c, s: "yes", False, "verifier.labels=mine:f returned 'yes' (str) for completion 0"),
        (lambda cs, ss: [True], True, "verifier.labels=mine:f returned 1 labels for 2 completions"),
        (lambda cs, ss: True, True, "verifier.labels=mine:f returned a bool, not a list of labels"),
        (lambda cs, ss: [True, 2], True, "verifier.labels=mine:f returned 2 (int) for completion 1"),
    ],
)
def test_a_wrong_result_is_one_message_naming_the_key(func, batched, message):
    with pytest.raises(UserError) as err:
        user_verifier(func, "mine:f", batched)(["a", "b"], ["a", "b"])
    assert message in str(err.value)


def test_what_the_users_labels_raise_is_one_message_naming_the_key():
    def is_correct(completion, solution):
        return {"a": True}[completion]

    verify = user_verifier(is_correct, "my_checks:is_correct", batched=False)
    assert verify(["a"], ["x"]) == [True]
    with pytest.raises(
        UserError, match=r"verifier.labels=my_checks:is_correct raised KeyError: 'b' \(on completion 1\)"
    ):
        verify(["a", "b"], ["x", "y"])


def test_the_correct_reward_follows_the_run_labels():
    components = typed_components(compose_config(["reward=correct"]).reward)
    for labels, expected in [("math_verify", [1.0, None, None]), ("exact_match", [1.0, 1.0, None])]:
        (correct,) = build_rewards(components, {"verifier": build_labels(verifier_cfg(labels=labels), ["4"])})
        assert correct.__name__ == "correct"
        completions = [[{"role": "assistant", "content": text}] for text in ("\\boxed{4}", "\\boxed{four}", "x")]
        assert correct(prompts=[], completions=completions, solution=["4", "four", None]) == expected


def test_the_verification_benchmark_is_cached_per_labeller(cfg_train):
    cfg = cfg_train
    args = (cfg.eval.verification_benchmark, cfg.model, cfg.dataset, 16)
    assert benchmark_key(*args) == benchmark_key(*args, "math_verify")
    assert benchmark_key(*args, "exact_match") != benchmark_key(*args)
    # settings added at their defaults leave the key of a set cached before them as it was
    dataset = OmegaConf.to_container(cfg.dataset)
    del dataset["function"], dataset["function_args"]
    assert benchmark_key(args[0], args[1], OmegaConf.create(dataset), 16) == benchmark_key(*args)


# ---- a user's project: resolve-time messages, one training run, evaluate ----------------------------------------

USER_MODULE = '''
import json
import os


def rows(n=24, prefix="Repeat"):
    """The user's dataset: a question and a reply field of their own names."""
    return [{"prompt_text": f"{prefix} the word number {i}.", "reply": "ab"[: 1 + i % 2]} for i in range(n)]


def parity(completion, solution):
    """Correct when the completion and the reference have lengths of the same parity; every call logged."""
    label = (len(completion) + len(solution)) % 2 == 0
    with open("labels.jsonl", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "completion": completion, "solution": solution, "label": label}))
        f.write("\\n")
    return label


def three(completion, solution, extra):
    return True


def batched(completions):
    return [True for _ in completions]


def not_rows(n=3):
    return "abc"


def splits():
    return {"train": rows(8), "validation": rows(2)}


NOT_CALLABLE = 3
'''

DATASET_YAML = """
    # the user's own dataset option: rows from their function
    name: mine
    source: function
    function: user_task:rows
    function_args: {n: 24}
    question_field: prompt_text
    answer_field: reply
    train_size: null
"""


def parity(completion: str, solution: str) -> bool:
    return (len(completion) + len(solution)) % 2 == 0


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "user_task.py").write_text(USER_MODULE)
    (tmp_path / "configs" / "dataset").mkdir(parents=True)
    (tmp_path / "configs" / "dataset" / "mine.yaml").write_text(textwrap.dedent(DATASET_YAML))
    return tmp_path


RESOLVE_CASES = {
    "not a built-in": (
        ["verifier.labels=exact"],
        "verifier.labels=exact: not a built-in (math_verify, exact_match, task_score)",
    ),
    "no module": (["verifier.labels=no_such:f"], "verifier.labels=no_such:f: module 'no_such' not found"),
    "no attribute": (["verifier.labels=user_task:nope"], "module 'user_task' has no attribute 'nope'"),
    "not callable": (
        ["verifier.labels=user_task:NOT_CALLABLE"],
        "verifier.labels=user_task:NOT_CALLABLE: not callable",
    ),
    "signature": (
        ["verifier.labels=user_task:three"],
        "verifier.labels=user_task:three: cannot be called with two arguments (missing a required argument: 'extra')",
    ),
    "batched signature": (
        ["verifier.labels=user_task:batched", "verifier.labels_batched=true"],
        "verifier.labels=user_task:batched: cannot be called with two arguments",
    ),
    "batched built-in": (["verifier.labels=exact_match", "verifier.labels_batched=true"], "is built in"),
    "with genrm": (["scorer=genrm", "verifier.labels=user_task:three"], "verifier.labels=user_task:three"),
    "no function": (["dataset=function"], "dataset.function is required with dataset=function"),
    "data module": (["dataset=function", "dataset.function=nope:rows"], "dataset.function=nope:rows: module 'nope'"),
    "data args": (
        ["dataset=mine", "+dataset.function_args.colour=red"],
        "dataset.function=user_task:rows: does not take the keys of dataset.function_args ['colour', 'n']: got an "
        "unexpected keyword argument 'colour'",
    ),
    "data return": (
        ["dataset=function", "dataset.function=user_task:not_rows"],
        "dataset.function=user_task:not_rows returned a str: a dataset function returns rows",
    ),
    "data split": (
        ["dataset=function", "dataset.function=user_task:splits"],
        "dataset.function=user_task:splits returned a mapping with the keys ['train', 'validation'], without ['test']",
    ),
    "data field": (
        ["dataset=function", "dataset.function=user_task:rows"],
        "dataset.function=user_task:rows: row 0 has no dataset.question_field='question' and no "
        "dataset.answer_field='answer'; its keys: ['prompt_text', 'reply']",
    ),
    "fine": (["dataset=mine", "verifier.labels=user_task:parity", "reward=correct"], None),
    "splits": (
        ["dataset=function", "dataset.function=user_task:splits", "dataset.eval_split=validation"]
        + ["dataset.question_field=prompt_text", "dataset.answer_field=reply"],
        None,
    ),
}

# Resolve (every check before any model loads), then the data (called before the model loads, too).
REPORT = """
from grpo_exp.data import load_splits
from grpo_exp.run.build import build_parts


def report(spec):
    train, held_out = load_splits(spec.cfg.dataset)
    build_parts(spec, train["solution"])
    return {"sizes": [len(train), len(held_out)], "question": held_out[0]["question"]}
"""


def test_a_bad_verifier_or_dataset_function_is_one_message_naming_the_key(project):
    base = [*TINY_RUN, "logger=none", f"hydra.searchpath=[file://{project / 'configs'}]"]
    cases = {name: overrides for name, (overrides, _) in RESOLVE_CASES.items()}
    messages = resolve_cases(cases, base, cwd=project, report=REPORT)
    for name, (_, expected) in RESOLVE_CASES.items():
        if expected is not None:
            assert isinstance(messages[name], str) and expected in messages[name], (name, messages[name])
    assert messages["fine"]["sizes"] == [20, 4]  # 24 rows, dataset.eval_size=4 held out
    assert messages["fine"]["question"].startswith("Repeat the word number")
    assert messages["splits"] == {
        "sizes": [8, 2],
        "question": "Repeat the word number 0.",
    }  # a mapping of splits, taken as it is
    assert not (project / "labels.jsonl").exists()  # nothing was labelled: no model, no answer


def grpo_exp(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`grpo-exp <args>`, run from `cwd` (the user's project directory), as they run it."""
    assert GRPO_EXP.is_file(), f"{GRPO_EXP} is missing: install the package (make install)"
    return run_command([GRPO_EXP, *args], cwd=cwd, timeout=timeout)


def test_evaluate_finds_the_config_directories_a_run_had(tmp_path):
    from grpo_exp.run.sources import resolve_source, run_config_sources

    run_dir, configs = tmp_path / "run", tmp_path / "configs"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoint-final").mkdir()
    configs.mkdir()
    sources = [
        {"path": "hydra.conf", "schema": "pkg", "provider": "hydra"},
        {"path": str(Path(__file__).parents[1] / "conf"), "schema": "file", "provider": "main"},
        {"path": "virtual", "schema": "grpo-exp", "provider": "grpo-exp"},
        {"path": "configs", "schema": "file", "provider": "command-line"},  # relative: to the run's cwd
        {"path": "my_pkg.conf", "schema": "pkg", "provider": "hydra.searchpath in command-line"},
        {"path": "", "schema": "structured", "provider": "schema"},
    ]
    hydra = {"hydra": {"runtime": {"cwd": str(tmp_path), "config_sources": sources}}}
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["dataset=mine", "hydra.verbose=true"]))
    expected = [("command-line", f"file://{configs}"), ("hydra.searchpath in command-line", "pkg://my_pkg.conf")]
    assert run_config_sources(run_dir) == (expected, str(tmp_path))
    source = resolve_source([str(run_dir), "eval.samples=0"], [str(configs)])
    assert source.config_sources == expected  # the one given again is not repeated
    assert source.overrides[0] == "dataset=mine" and source.overrides[-1] == "eval.samples=0"
    assert source.run_cwd == str(tmp_path)
    with pytest.raises(UserError, match="--config-dir nope: no such directory"):
        resolve_source(["model=tiny"], ["nope"])


def label_calls(project: Path) -> list[dict]:
    return [json.loads(line) for line in (project / "labels.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_the_users_data_and_labels_train_evaluate_and_are_measured(project):
    """TRL's GRPOTrainer trains the tiny model two steps on the user's rows, rewarded by `correct` with the user's
    labels; every statistic of correctness is those labels; `grpo-exp evaluate` on the run labels with them too."""
    run_dir = project / "run"
    result = grpo_exp(
        project, "train", "--config-dir", "configs", *TINY_RUN, "logger=none", "dataset=mine", "reward=correct",
        "verifier.labels=user_task:parity", "eval.every=1", "stats.table_every=1", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]

    # The held-out answers: the user's rows, labelled by the user's function (the random model is rarely right by
    # math-verify; by parity about half the answers are).
    after = [json.loads(line) for line in (run_dir / "eval_after.jsonl").read_text().splitlines()]
    assert len(after) == 4 and all(s["question"].startswith("Repeat the word number") for s in after)
    assert {s["solution"] for s in after} <= {"a", "ab"}
    assert [s["correct"] for s in after] == [parity(s["completion"], s["solution"]) for s in after]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["heldout_accuracy_after"] == pytest.approx(sum(s["correct"] for s in after) / 4)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    validations = [m for m in metrics if "heldout/accuracy" in m]
    assert validations and validations[-1]["heldout/accuracy"] == pytest.approx(summary["heldout_accuracy_after"])

    # Each step's groups: every completion (stats.table_every=1; 2 groups of 2) with its label, the correct reward
    # and the group statistics all from the user's labels.
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "rewards/correct/mean" in m]
    assert len(steps) == 2
    for step in (1, 2):
        group = [s for s in samples if s["step"] == step]
        assert len(group) == 4
        labels = [
            float(parity(s["completion"], solution)) for s, solution in zip(group, solutions_of(group), strict=True)
        ]
        assert [s["correct"] for s in group] == labels
        assert [s["reward/correct"] for s in group] == labels
        logged = steps[step - 1]
        assert logged["rewards/correct/mean"] == pytest.approx(sum(labels) / 4)
        assert logged["groups/mean@k"] == pytest.approx(sum(labels) / 4)
        assert logged["groups/pass@1"] == pytest.approx(sum(labels) / 4)
    assert any(call["label"] for call in label_calls(project)) and not all(c["label"] for c in label_calls(project))
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["verifier"]["labels"] == "user_task:parity" and saved["dataset"]["function"] == "user_task:rows"

    # evaluate: the run's config directory (dataset=mine is the user's), the user's labels.
    before = len(label_calls(project))
    result = grpo_exp(project, "evaluate", str(run_dir), "eval.samples=2")
    assert result.returncode == 0, result.stderr[-3000:]
    calls = label_calls(project)[before:]
    assert len(calls) == 4 + 4 * 2  # greedy, then 2 samples of each problem
    assert {c["pid"] for c in calls}.isdisjoint({c["pid"] for c in label_calls(project)[:before]})
    greedy, sampled = [c["label"] for c in calls[:4]], [c["label"] for c in calls[4:]]
    results = json.loads(latest_evaluation(run_dir).read_text())
    assert results["dataset"] == "mine" and results["problems"] == 4
    assert results["greedy accuracy"] == pytest.approx(sum(greedy) / 4)
    assert results["pass@1"] == pytest.approx(sum(sampled) / 8)
    assert results["pass@2"] == pytest.approx(sum(a or b for a, b in zip(sampled[::2], sampled[1::2], strict=True)) / 4)

    # From another directory, the run's modules import from the directory it was started in.
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    result = grpo_exp(elsewhere, "evaluate", str(run_dir), "eval.samples=0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(label_calls(elsewhere)) == 4
    # A checkpoint outside its run: the user's config directory given to evaluate.
    checkpoint = project / "exported"
    shutil.copytree(run_dir / "checkpoint-final", checkpoint)
    args = ["trainer=debug", "dataset=mine", "dataset.eval_size=4", "verifier.labels=user_task:parity"]
    result = grpo_exp(project, "evaluate", "--config-dir", "configs", str(checkpoint), *args, "eval.samples=0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(latest_evaluation(checkpoint).read_text())["greedy accuracy"] == pytest.approx(sum(greedy) / 4)


def solutions_of(group: list[dict]) -> list[str]:
    """The reference of each sampled completion: the user's rows' replies, found by question."""
    replies = {f"Repeat the word number {i}.": "ab"[: 1 + i % 2] for i in range(24)}
    return [next(reply for question, reply in replies.items() if question in s["prompt"]) for s in group]
