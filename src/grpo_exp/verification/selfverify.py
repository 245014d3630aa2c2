"""Self-verification task: on-policy samples -> labelled, filtered, balanced, diverse verification prompts.

Pure functions (no trainer state), after "Learning to Self-Verify" (arXiv 2602.07594): completions are
labelled correct/incorrect by the run's labels; those without an extractable answer are dropped, and so are
problems whose rollouts are all wrong (configurable); then as many "Yes" as "No" examples (a configurable
share) are drawn with a seed, spread over as many problems as possible, at most `per_problem` per problem,
distinct answers first. Each becomes a prompt asking the policy to judge the answer, ending in a boxed
Yes/No; the reward is 1 when the judgement matches the label (optionally x min(pass rate, 0.5)).
"""

import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass

from grpo_exp.answers import AnswerExtractor
from grpo_exp.measures import auroc
from grpo_exp.schema import ShownPart
from grpo_exp.text import BOXED, last_boxed_span

YES, NO = "Yes", "No"


@dataclass(frozen=True)
class Candidate:
    problem: int  # which problem (group) the completion answers
    question: str
    response: str  # the full completion
    answer: str | None  # its extracted final answer (None: none could be extracted)
    correct: bool
    pass_rate: float  # share of the problem's rollouts that were correct

    @property
    def label(self) -> str:
        return YES if self.correct else NO


def candidates_from_groups(
    questions: list[str],
    texts: list[str],
    labels: list[bool | None],
    size: int,
    extract: AnswerExtractor,
    first_problem: int = 0,
) -> list[Candidate]:
    """Labelled candidates from consecutive groups of `size` completions, one problem (question) per group, each
    with its final answer as the run's extractor reads it (`extract`: verifier.answer).

    `questions` has one entry per group; unlabelled completions are left out, and so are groups with no label.
    """

    found = []
    for index, question in enumerate(questions):
        members = [(texts[i], labels[i]) for i in range(index * size, (index + 1) * size) if labels[i] is not None]
        if not members:
            continue
        pass_rate = sum(label for _, label in members) / len(members)
        found += [
            Candidate(first_problem + index, question, text, extract(text), bool(label), pass_rate)
            for text, label in members
        ]
    return found


def filter_candidates(
    candidates: list[Candidate], drop_no_answer: bool = True, drop_all_wrong: bool = True
) -> tuple[list[Candidate], dict[str, int]]:
    """Drop completions with no extractable answer, and problems whose rollouts are all wrong.

    Returns the kept candidates and how many each rule removed (each candidate counted once, first rule first).
    """
    removed = {"no_answer": 0, "all_wrong": 0}
    kept = []
    for c in candidates:
        if drop_no_answer and c.answer is None:
            removed["no_answer"] += 1
        elif drop_all_wrong and c.pass_rate == 0.0:
            removed["all_wrong"] += 1
        else:
            kept.append(c)
    return kept, removed


def _spread(pool: list[Candidate], rng: random.Random) -> list[Candidate]:
    """A pool ordered for diversity: round-robin over problems (in random order); within a problem, distinct
    answers before repeated ones, ties in random order."""
    by_problem: dict[int, list[Candidate]] = defaultdict(list)
    for c in pool:
        by_problem[c.problem].append(c)
    queues = []
    for problem in sorted(by_problem):
        members = by_problem[problem][:]
        rng.shuffle(members)
        seen: set[str | None] = set()
        first, repeats = [], []
        for c in members:
            (repeats if c.answer in seen else first).append(c)
            seen.add(c.answer)
        queues.append(first + repeats)
    rng.shuffle(queues)
    ordered = []
    for depth in range(max((len(q) for q in queues), default=0)):
        ordered += [q[depth] for q in queues if depth < len(q)]
    return ordered


def select_samples(
    candidates: list[Candidate], n: int, yes_share: float = 0.5, per_problem: int = 2, seed: int = 0
) -> list[Candidate]:
    """Up to n candidates: n * yes_share correct (rounded up or down at random, with the right odds) and the
    rest incorrect where the pools allow (a pool
    that runs short is made up from the other), at most `per_problem` from any problem, spread over problems,
    in a seeded random order."""
    rng = random.Random(seed)
    # floor or ceil of n * yes_share, at random with the right odds: with n = 1 (one verification group per
    # step) plain rounding would pick the same label every step.
    share = n * yes_share
    yes = math.floor(share) + (rng.random() < share - math.floor(share))
    wanted = {YES: yes, NO: n - yes}
    pools = {label: _spread([c for c in candidates if c.label == label], rng) for label in (YES, NO)}
    taken_per_problem: dict[int, int] = defaultdict(int)
    chosen: list[Candidate] = []
    # Alternate between the labels so that neither uses up the per-problem budget first.
    cursors = {YES: 0, NO: 0}
    counts = {YES: 0, NO: 0}
    progress = True
    while progress and len(chosen) < n:
        progress = False
        for label in (YES, NO):
            pool = pools[label]
            while counts[label] < wanted[label] and cursors[label] < len(pool):
                candidate = pool[cursors[label]]
                cursors[label] += 1
                if taken_per_problem[candidate.problem] < per_problem:
                    taken_per_problem[candidate.problem] += 1
                    counts[label] += 1
                    chosen.append(candidate)
                    progress = True
                    break
    # A pool ran short: fill from the other one, without replacement and within the per-problem cap.
    chosen_ids = {id(c) for c in chosen}  # identity: two equal samples are still two samples
    leftovers = _spread([c for c in candidates if id(c) not in chosen_ids], rng)
    for candidate in leftovers:
        if len(chosen) >= n:
            break
        if taken_per_problem[candidate.problem] < per_problem:
            taken_per_problem[candidate.problem] += 1
            chosen.append(candidate)
    rng.shuffle(chosen)
    return chosen


def matched_pairs(candidates: list[Candidate], pairs: int, seed: int = 0) -> list[Candidate]:
    """Up to `pairs` problems with mixed results, each giving one correct and one incorrect answer (distinct
    answers, drawn with a seed): [yes, no, yes, no, ...]. Exactly balanced by construction, and each pair asks
    the same question twice, so that a verdict can only be right on both by telling the answers apart."""
    rng = random.Random(seed)
    by_problem: dict[int, dict[bool, list[Candidate]]] = defaultdict(lambda: {True: [], False: []})
    for c in candidates:
        by_problem[c.problem][c.correct].append(c)
    mixed = sorted(p for p, members in by_problem.items() if members[True] and members[False])
    chosen = []
    for problem in rng.sample(mixed, min(pairs, len(mixed))):
        right = rng.choice(by_problem[problem][True])
        wrong = [c for c in by_problem[problem][False] if c.answer != right.answer] or by_problem[problem][False]
        chosen += [right, rng.choice(wrong)]
    return chosen


def balanced_set(candidates: list[Candidate], per_label: int, per_problem: int, seed: int) -> list[Candidate]:
    """As many correct as incorrect answers (at most `per_label` each, at most `per_problem` per problem, spread
    over problems, distinct answers first), in a seeded order: a fixed verification benchmark."""
    chosen = select_samples(candidates, 2 * per_label, 0.5, per_problem, seed)
    size = min(sum(c.correct for c in chosen), sum(not c.correct for c in chosen))
    kept = {True: 0, False: 0}
    balanced = []
    for c in chosen:
        if kept[c.correct] < size:
            kept[c.correct] += 1
            balanced.append(c)
    return balanced


def shown_answer(candidate: Candidate, show: ShownPart = ShownPart.answer) -> str:
    """What a verifier is shown of a candidate: its final answer only, or its full solution."""
    return candidate.response if show is ShownPart.solution else (candidate.answer or "")


def verification_prompt(
    candidate: Candidate, template: str, show: ShownPart = ShownPart.answer
) -> list[dict[str, str]]:
    """The chat prompt asking the policy to judge a candidate (see shown_answer)."""
    shown = shown_answer(candidate, show)
    return [{"role": "user", "content": template.replace("{question}", candidate.question).replace("{answer}", shown)}]


VERDICT_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_judgement(text: str, strict: bool = True) -> str | None:
    """The policy's verdict: the last \\boxed{Yes|No} (case-insensitive); None when malformed.

    Not strict (for small models that rarely box): without a box, the first standalone "yes" or "no"."""
    return verdict_span(text, strict)[0]


def verdict_span(text: str, strict: bool = True) -> tuple[str | None, int | None]:
    """(the verdict parse_judgement reads, the offset in `text` just after what it read it from); (None, None)
    when malformed. What follows the offset holds no verdict that would override it."""
    span = last_boxed_span(text)
    if span is not None:
        content = text[span[0] + len(BOXED) : span[1] - 1]
        verdict = {"yes": YES, "no": NO}.get(re.sub(r"[^a-z]", "", content.lower()))
        return (verdict, span[1]) if verdict else (None, None)
    match = None if strict else VERDICT_WORD.search(text)
    return (None, None) if match is None else ({"yes": YES, "no": NO}[match.group(1).lower()], match.end())


def verification_reward(judgement: str | None, label: str, pass_rate: float, scale_by_pass_rate: bool) -> float:
    """1 for a verdict that matches the label (x min(pass rate, 0.5) when scaled); 0 for a wrong or malformed one."""
    if judgement != label:
        return 0.0
    return min(pass_rate, 0.5) if scale_by_pass_rate else 1.0


# ---- metrics of a verifier's judgements against the correctness labels -------------------------------------


def judgement_metrics(predicted_yes: list[bool | None], actual_yes: list[bool], prefix: str) -> dict[str, float]:
    """Accuracy (malformed counts as wrong) and precision / recall / F1 of "Yes"."""
    pairs = list(zip(predicted_yes, actual_yes, strict=True))
    if not pairs:
        return {}
    tp = sum(p is True and a for p, a in pairs)
    fp = sum(p is True and not a for p, a in pairs)
    fn = sum(p is not True and a for p, a in pairs)
    precision = tp / (tp + fp) if tp + fp else math.nan
    recall = tp / (tp + fn) if tp + fn else math.nan
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else math.nan
    return {
        f"{prefix}/accuracy": sum(p == a for p, a in pairs) / len(pairs),
        f"{prefix}/precision_yes": precision,
        f"{prefix}/recall_yes": recall,
        f"{prefix}/f1_yes": f1,
        f"{prefix}/malformed": sum(p is None for p, _ in pairs) / len(pairs),
    }


def brier(scores: list[float], labels: list[bool]) -> float:
    return sum((s - y) ** 2 for s, y in zip(scores, labels, strict=True)) / len(scores) if scores else math.nan


def expected_calibration_error(scores: list[float], labels: list[bool], bins: int = 10) -> float:
    """ECE: the bin-weighted gap between mean confidence and accuracy, over equal-width bins of P(Yes)."""
    if not scores:
        return math.nan
    total = 0.0
    for b in range(bins):
        members = [(s, y) for s, y in zip(scores, labels, strict=True) if min(int(s * bins), bins - 1) == b]
        if members:
            confidence = sum(s for s, _ in members) / len(members)
            accuracy = sum(y for _, y in members) / len(members)
            total += len(members) / len(scores) * abs(confidence - accuracy)
    return total


def probability_metrics(p_yes: list[float], labels: list[bool], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}/auroc": auroc(p_yes, labels),
        f"{prefix}/brier": brier(p_yes, labels),
        f"{prefix}/ece": expected_calibration_error(p_yes, labels),
    }
