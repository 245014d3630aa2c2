"""A task whose answers are words, run as a user runs it: a project outside the repository with its own data file and
experiment YAML, the built-in `exact_match` labels, the embedded model. Every statistic of correctness (held-out
accuracy, pass@k, maj@k, distinct answers, the sample tables, `grpo-exp evaluate`) follows those labels, and the
answers are read by the word rule that `verifier.answer=auto` chose."""

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_exp.answers import normalise_answer, phrase, vote_key
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import latest_evaluation
from tests.helpers.cli import run_command

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")
WORDS = (
    "apple island pencil river garden candle monkey rocket violin window yellow basket dragon forest guitar hammer "
    "jacket kettle lemon marble needle orange parrot quilt saddle tiger umbrella velvet walnut zebra"
).split()

EXPERIMENT = """
    # @package _global_
    # Which of two words comes first alphabetically: answers are words, labelled by exact_match.
    defaults:
      - override /dataset: files
      - override /reward: correct
      - override /logger: none
      - _self_
    dataset:
      path: data/words.jsonl
      eval_size: 6
      prompt:
        template: "{question} Reply with the word only."
    verifier:
      labels: exact_match
    trainer:
      max_steps: 2
      num_generations: 4
      prompts_per_step: 2
      max_completion_length: 20
      save_steps: 0  # no resume checkpoint: 1.5 GB of the embedded model's weights and optimizer state
    eval:
      every: 2
      every_samples: 2
    stats:
      table_every: 1
"""


def labelled(completion: str, reference: str) -> bool:
    """exact_match as the test reads it: the answer by the word rule, normalised, equal to the reference."""
    answer = phrase(completion)
    return answer is not None and normalise_answer(answer) == normalise_answer(reference)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("words")
    rng = random.Random(0)
    (root / "data").mkdir()
    with (root / "data" / "words.jsonl").open("w") as f:
        for _ in range(60):
            a, b = rng.sample(WORDS, 2)
            question = f'Which word comes first in alphabetical order: "{a}" or "{b}"?'
            f.write(json.dumps({"question": question, "answer": min(a, b)}) + "\n")
    (root / "configs" / "experiment").mkdir(parents=True)
    (root / "configs" / "experiment" / "words.yaml").write_text(textwrap.dedent(EXPERIMENT))
    return root


def grpo_exp(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_command([GRPO_EXP, *args], cwd=cwd, timeout=1500)


@pytest.mark.slow
def test_a_word_task_trains_and_every_statistic_follows_the_labels(project):
    run_dir = project / "run"
    result = grpo_exp(project, "train", "--config-dir", "configs", "+experiment=words", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["labels"] == "exact_match" and summary["answer"] == "phrase"  # auto: the references are words
    assert summary["steps"] == 2 and "smollm2_135m" in summary["model"]  # the embedded model trained
    checkpoint_config = json.loads((run_dir / "checkpoint-final" / "config.json").read_text())
    assert "quantization_config" not in checkpoint_config  # a plain, trainable checkpoint
    assert checkpoint_config["num_hidden_layers"] == 30
    assert "answers read by phrase" in result.stdout

    # held-out greedy answers: labelled by the word rule, the accuracy their mean
    after = [json.loads(line) for line in (run_dir / "eval_after.jsonl").read_text().splitlines()]
    assert len(after) == 6
    assert [s["correct"] for s in after] == [labelled(s["completion"], s["solution"]) for s in after]
    assert [s["answer"] for s in after] == [phrase(s["completion"]) for s in after]
    assert summary["heldout_accuracy_after"] == pytest.approx(sum(s["correct"] for s in after) / 6)
    assert summary["heldout_gain_format"] + summary["heldout_gain_content"] == pytest.approx(
        summary["heldout_accuracy_after"] - summary["heldout_accuracy_before"]
    )

    # each step's sampled groups: the answer, the reference and the label of every completion
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 2 * 4
    for s in samples:
        assert s["answer"] == phrase(s["completion"]) and s["reference"] in WORDS
        assert s["correct"] == float(labelled(s["completion"], s["reference"])) == s["reward/correct"]
    labels = [s["correct"] for s in after] + [bool(s["correct"]) for s in samples]
    assert any(labels) and not all(labels), "the embedded model answers some, not all, in the bare format"
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "groups/maj@k" in m]
    assert len(steps) == 2
    for step, logged in enumerate(steps, start=1):
        group = [s for s in samples if s["step"] == step]
        votes = [[vote_key(s["answer"]) for s in group[g : g + 4]] for g in (0, 4)]
        distinct = sum(len({v for v in vs if v is not None}) / 4 for vs in votes) / 2
        assert logged["diversity/distinct_answers"] == pytest.approx(distinct) and distinct > 0
        assert logged["groups/maj@k"] is not None and 0.0 <= logged["groups/maj@k"] <= 1.0
        assert logged["groups/pass@1"] == pytest.approx(sum(s["correct"] for s in group) / 8)
    validation = [m for m in read_metrics(run_dir / "metrics.jsonl") if "heldout/maj@2" in m]
    assert validation and validation[-1]["heldout/maj@2"] is not None

    # evaluate: the same labels and extractor, each problem's answers written, majority votes that follow them
    result = grpo_exp(project, "evaluate", str(run_dir), "eval.samples=3")
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(latest_evaluation(run_dir).read_text())
    assert results["labels"] == "exact_match" and results["answer"] == "phrase"
    assert 0.0 <= results["pass@1"] <= results["pass@2"] <= results["pass@3"] <= 1.0
    problems = [json.loads(line) for line in (run_dir / results["answers_file"]).read_text().splitlines()]
    assert len(problems) == 6
    assert results["greedy accuracy"] == pytest.approx(sum(p["greedy"]["correct"] for p in problems) / 6)
    hits = 0
    for p in problems:
        assert [s["correct"] for s in p["samples"]] == [labelled(s["completion"], p["solution"]) for s in p["samples"]]
        votes = [vote_key(s["answer"]) for s in p["samples"] if s["answer"] is not None]
        top = max(votes, key=votes.count) if votes else None  # ties: the first answer seen
        hits += any(vote_key(s["answer"]) == top and s["correct"] for s in p["samples"])
    voted = sum(1 for p in problems if any(s["answer"] is not None for s in p["samples"]))
    assert results["maj@3"] == pytest.approx(hits / voted)
