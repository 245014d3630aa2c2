"""The run's correctness labels (`verifier.labels`): who decides whether an answer is correct.

One labeller per run, built once (grpo_exp.run.build) and read by everything that needs a label: held-out accuracy
(before / after training, validations, `python -m grpo_exp.evaluate`), pass@k and maj@k, the group statistics,
the labels of the self-verification task and the verification benchmark, the AUROC of the judge and confidence
components against correctness, and the `correct` reward component. It applies with every `scorer=` option
(the P(Yes) scorer, a separate group). Built-in:

- math_verify (the default): math-verify equivalence of the stated final answer with the reference
  (grpo_exp.verification.rule);
- task_score: a reasoning-gym task's own score_answer gives the final answer full marks
  (grpo_exp.verification.task_score; the rows of a reasoning-gym dataset only);
- exact_match: the final answer, read by the run's extractor (verifier.answer: grpo_exp.answers), equals the
  reference once both are normalised (normalise_answer: case, quotes, \\text{}, a final period): for tasks whose
  answers are words, labels or codes rather than mathematics.

Or the user's own function by import path, `verifier.labels=module:name` (the current directory importable):

    def is_correct(completion: str, solution: str) -> bool | None: ...

called once per answer with the answer's text (a multi-turn trajectory's final turn) and the reference (the
dataset's answer, as a string); None: cannot be judged (left out of accuracies, as an unparseable reference is).
Answers without a reference (the self-verification task's verification prompts) are not passed to it: their label
is None. With `verifier.labels_batched=true` it is called once per batch instead:
f(completions: list[str], solutions: list[str]) -> one bool or None per completion. Its signature is checked at
resolve time, before any model loads; a result that is not a bool or None stops the run naming the key.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omegaconf import DictConfig

from grpo_exp.answers import BUILT_IN as BUILT_IN_ANSWERS
from grpo_exp.answers import AnswerExtractor, build_extractor, normalise_answer
from grpo_exp.errors import UserError
from grpo_exp.plugins import import_callable, signature_of
from grpo_exp.registries import by_name
from grpo_exp.verification.rule import TAIL_CHARS, Verifier, answer_score
from grpo_exp.verification.task_score import check_task_rows, missing_entries, task_score

KEY = "verifier.labels"
CONVENTION = (
    "a correctness function is f(completion: str, solution: str) -> bool | None (None: cannot be judged), or with "
    "verifier.labels_batched=true f(completions: list[str], solutions: list[str]) -> list[bool | None]"
)


# name -> f(the run's answer extractor) -> Verifier, each registered beside its code (`@labels_rule(name)`), in the
# order the refusals list them
BUILT_IN: dict[str, Callable[[AnswerExtractor], Verifier]] = {}


# Decorator: `@labels_rule(name)` on a function that, given the run's answer extractor, makes the built-in labels
# `name` (verifier.labels=name).
labels_rule = by_name(BUILT_IN, "labels named")


@labels_rule("math_verify")
def math_verify_verifier(extract: AnswerExtractor) -> Verifier:
    """Rule-based: math-verify equivalence of the final answer with the reference (None: no usable reference;
    grpo_exp.verification.rule)."""

    def verify(texts: list[str], solutions: list[str | None], entries=None) -> list[bool | None]:
        scores = [None if s is None else answer_score(t, s, extract) for t, s in zip(texts, solutions, strict=True)]
        return [None if s is None else s >= 0.5 for s in scores]

    return verify


def exact_match(completion: str, solution: str, extract: AnswerExtractor) -> bool | None:
    """The completion's final answer (`extract`: the run's extractor) equals the reference, both normalised (None: an
    empty reference)."""
    reference = normalise_answer(str(solution))
    if not reference:
        return None
    answer = extract(completion[-TAIL_CHARS:])
    return answer is not None and normalise_answer(answer) == reference


@labels_rule("exact_match")
def exact_match_verifier(extract: AnswerExtractor) -> Verifier:
    def verify(texts: list[str], solutions: list[str | None], entries=None) -> list[bool | None]:
        return [None if s is None else exact_match(t, s, extract) for t, s in zip(texts, solutions, strict=True)]

    return verify


@labels_rule("task_score")
def task_score_verifier(extract: AnswerExtractor) -> Verifier:
    """Correct when the reasoning-gym task's own scorer gives the answer full marks
    (grpo_exp.verification.task_score)."""

    def verify(texts: list[str], solutions: list[str | None], entries: list[str | None] | None = None):
        if entries is None:
            raise missing_entries("verifier.labels=task_score")
        return [
            None if s is None or e is None else task_score(t, e, extract) >= 1.0
            for t, s, e in zip(texts, solutions, entries, strict=True)
        ]

    return verify


@dataclass(frozen=True)
class Labels:
    """The run's correctness labels (a Verifier: texts, references -> True / False / None each) and the answer
    extractor they and every answer statistic read (verifier.answer; `answer_rule`: its name, auto resolved)."""

    verify: Verifier
    answer: AnswerExtractor
    answer_rule: str

    def __call__(
        self, texts: list[str], solutions: list[str | None], entries: list[str | None] | None = None
    ) -> list[bool | None]:
        """`entries`: each answer's reasoning-gym entry (the task_entry column), for verifier.labels=task_score; None,
        or all None: rows without a task."""
        return self.verify(texts, solutions, entries if entries and any(entries) else None)


def _user_function(verifier_cfg: DictConfig) -> Callable:
    path = verifier_cfg.labels
    if ":" not in path and "." not in path:
        raise UserError(
            f"{KEY}={path}: not a built-in ({', '.join(BUILT_IN)}) nor an import path; write module:name, e.g. "
            f"{KEY}=my_checks:is_correct ({CONVENTION})"
        )
    return import_callable(path, KEY, "a correctness function")


def check_labels(verifier_cfg: DictConfig, dataset_cfg: DictConfig) -> None:
    """The resolve phase: a built-in name (task_score: on a reasoning-gym task's rows), or an importable function
    taking (completion, solution) (batched: (completions, solutions)); else one UserError naming the key."""
    if verifier_cfg.labels in BUILT_IN:
        if verifier_cfg.labels_batched:
            raise UserError(
                f"verifier.labels_batched=true is for a function of your own; {KEY}={verifier_cfg.labels} is built in"
            )
        if verifier_cfg.labels == "task_score":
            check_task_rows(KEY, dataset_cfg)
        return
    func = _user_function(verifier_cfg)
    signature = signature_of(func)
    if signature is None:
        return
    arguments = ([], []) if verifier_cfg.labels_batched else ("", "")
    try:
        signature.bind(*arguments)
    except TypeError as err:
        raise UserError(
            f"{KEY}={verifier_cfg.labels}: cannot be called with two arguments ({err}): {CONVENTION}; its signature "
            f"is {signature}"
        ) from None


def build_labels(verifier_cfg: DictConfig, references: list[str]) -> Labels:
    """The run's labeller and its answer extractor; `references`: the training set's answers (verifier.answer=auto
    chooses by them)."""
    extract, rule = build_extractor(verifier_cfg.answer, references)
    if verifier_cfg.labels in BUILT_IN:
        return Labels(BUILT_IN[verifier_cfg.labels](extract), extract, rule)
    verify = user_verifier(_user_function(verifier_cfg), verifier_cfg.labels, verifier_cfg.labels_batched)
    return Labels(verify, extract, rule)


def user_verifier(func: Callable, path: str, batched: bool) -> Verifier:
    """The user's function as a Verifier: called on the answers that have a reference, each result checked."""
    where = f"{KEY}={path}"

    def verify(texts: list[str], solutions: list[str | None], entries=None) -> list[bool | None]:
        labels: list[bool | None] = [None] * len(texts)
        judged = [i for i, solution in enumerate(solutions) if solution is not None]
        if not judged:
            return labels
        if batched:
            results = called(func, where, "the batch", [texts[i] for i in judged], [str(solutions[i]) for i in judged])
            is_array = getattr(results, "ndim", None) == 1  # a NumPy array or torch tensor of labels
            if isinstance(results, str | bytes) or not (isinstance(results, Sequence) or is_array):
                raise UserError(f"{where} returned a {type(results).__name__}, not a list of labels: {CONVENTION}")
            results = list(results)
            if len(results) != len(judged):
                raise UserError(f"{where} returned {len(results)} labels for {len(judged)} completions: {CONVENTION}")
        else:
            results = [called(func, where, f"completion {i}", texts[i], str(solutions[i])) for i in judged]
        for index, result in zip(judged, results, strict=True):
            labels[index] = checked_label(result, where, index)
        return labels

    return verify


def called(func: Callable, where: str, what: str, *args):
    """The user's function on `args`; what it raises, one UserError naming the key (not a traceback from deep in a
    run). Under several processes each labels its own share: a function that fails on some answers only stops one
    process, and the launcher then ends the others."""
    try:
        return func(*args)
    except Exception as err:  # noqa: BLE001 - the user's code: whatever it raises is theirs to see, in one line
        raise UserError(f"{where} raised {type(err).__name__}: {err} (on {what})") from err


def checked_label(value, where: str, index: int) -> bool | None:
    """True, False or None; a NumPy / torch boolean scalar is taken as its bool. Anything else: a UserError."""
    if value is None or isinstance(value, bool):
        return value
    if getattr(value, "ndim", None) == 0 and isinstance(value.item(), bool):
        return value.item()
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
    raise UserError(
        f"{where} returned {shown} ({type(value).__name__}) for completion {index}: labels are True, False or None "
        f"(cannot be judged); {CONVENTION}"
    )


def built_in_labels(labels: str = "math_verify", answer: str = "stated") -> Labels:
    """A built-in labeller with a built-in extractor, no config (benchmarks, tests)."""
    extract = BUILT_IN_ANSWERS[answer]
    return Labels(BUILT_IN[labels](extract), extract, answer)
