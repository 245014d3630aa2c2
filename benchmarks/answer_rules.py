"""How the built-in answer rules read real answers: `python -m benchmarks.answer_rules`.

The embedded SmolLM2-135M answers word tasks greedily, as a new user's first run would (each task's own prompt, no
instruction about the answer's form); each rule then reads every answer, and exact_match labels it. Beside them, the
lenient content check (the reference anywhere in the final sentence, grpo_exp.answers.lenient_match): an answer
that the content check finds right and a rule labels wrong is one the rule misreads (or a sentence that names the
reference without answering it).

The answers are generated once and saved (--answers, default experiments/answer_rules.json); `--score-only` scores a
saved file again, as after a change of the rules. Tasks marked `designed on` were looked at while the rules were
written; the others were not, and are where the claim is measured.

    python -m benchmarks.answer_rules [--problems 60] [--answers experiments/answer_rules.json] [--score-only]
"""

import argparse
import json
from pathlib import Path

from grpo_exp.answers import BUILT_IN, answer_is, answer_tags, boxed, last_line, lenient_match, normalise_answer
from support.config import resolved_config

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).parent.parent
# name -> (overrides, designed on: looked at while the rules were written)
TASKS: dict[str, tuple[list[str], bool]] = {
    "opposites": (["dataset=files", f"dataset.path={DATA / 'opposites.jsonl'}"], True),
    "family_relationships": (["dataset=reasoning_gym", "dataset.task=family_relationships"], True),
    "capitals": (
        [
            "dataset=files",
            f"dataset.path={REPO / 'examples/capitals/data/capitals.jsonl'}",
            "dataset.answer_field=capital",
            "dataset.eval_size=40",  # of its 60 rows
        ],
        False,
    ),
    "syllogism": (["dataset=reasoning_gym", "dataset.task=syllogism"], False),
    "isomorphic_strings": (["dataset=reasoning_gym", "dataset.task=isomorphic_strings"], False),
    "spell_backward": (
        ["dataset=reasoning_gym", "dataset.task=spell_backward", "+dataset.task_config.max_word_len=5"],
        False,
    ),
}


def phrase_before(text: str) -> str | None:
    """`phrase` as it was before stated_in_sentence: boxed, answer tags, "the answer is", else the last line."""
    for rule in (boxed, answer_tags, answer_is, last_line):
        answer = rule(text)
        if answer is not None:
            return answer
    return None


RULES = {"phrase (before)": phrase_before, "phrase": BUILT_IN["phrase"], "last_line": BUILT_IN["last_line"]}


def generate(problems: int) -> dict[str, list[dict]]:
    """Each task's held-out problems answered greedily by the embedded model: [{question, solution, completion}]."""
    from grpo_exp.data import load_splits
    from grpo_exp.run.heldout import heldout_accuracy
    from grpo_exp.run.setup import load_policy
    from grpo_exp.verification.labels import built_in_labels

    answers = {}
    model = tokenizer = None
    for task, (overrides, _) in TASKS.items():
        size = [] if any(o.startswith("dataset.eval_size=") for o in overrides) else [f"dataset.eval_size={problems}"]
        spec = resolved_config([*overrides, *size, "verifier.labels=exact_match"])
        cfg = spec.cfg
        _, heldout = load_splits(cfg.dataset)
        if model is None:
            tokenizer, model = load_policy(spec, spec.policy_dtype)
        result = heldout_accuracy(
            model,
            tokenizer,
            heldout,
            built_in_labels("exact_match", "phrase"),
            spec.eval_max_new_tokens,
            cfg.eval.batch_size,
            task,
            prepacked=cfg.eval.prepacked,
        )
        answers[task] = [
            {"question": s["question"], "solution": str(s["solution"]), "completion": s["completion"]}
            for s in result.samples
        ]
    return answers


def read_right(rule, sample: dict) -> bool:
    answer = rule(sample["completion"])
    return answer is not None and normalise_answer(answer) == normalise_answer(sample["solution"])


def score(answers: dict[str, list[dict]]) -> list[dict]:
    """Per task: exact_match accuracy under each rule, the content check's, and the misread share (content check
    right, rule wrong) of the new `phrase`."""
    rows = []
    for task, samples in answers.items():
        lenient = [bool(lenient_match(s["completion"], s["solution"])) for s in samples]
        row = {"task": task, "designed on": TASKS.get(task, ([], False))[1], "problems": len(samples)}
        row |= {rule: sum(read_right(func, s) for s in samples) / len(samples) for rule, func in RULES.items()}
        row["content check"] = sum(lenient) / len(samples)
        row["misread by phrase"] = sum(
            c and not read_right(RULES["phrase"], s) for c, s in zip(lenient, samples, strict=True)
        ) / len(samples)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.answer_rules")
    parser.add_argument("--problems", type=int, default=60)
    parser.add_argument("--answers", type=Path, default=REPO / "experiments" / "answer_rules.json")
    parser.add_argument("--score-only", action="store_true", help="score the saved answers again")
    args = parser.parse_args(argv)
    if args.score_only and not args.answers.is_file():
        parser.error(f"--answers {args.answers}: no such file (run without --score-only to generate it)")
    if args.score_only:
        answers = json.loads(args.answers.read_text())
    else:
        answers = generate(args.problems)
        args.answers.write_text(json.dumps(answers, indent=1) + "\n")
    rows = score(answers)
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
