"""Group statistics: pure functions on [prompts, G] tensors (G = group size), no trainer state.

GRPO learns only from the spread of rewards inside each group; these numbers show that spread per step.
NaN marks a missing value (a reward component that skipped a sample, a correctness label that could not
be decided) and is left out of every mean.
"""

import math
from collections import Counter

import torch

from grpo_exp.answers import AnswerExtractor, vote_key
from grpo_exp.measures import auroc


def label_values(labels: list[bool | None]) -> list[float]:
    """Correctness labels as numbers: 1.0, 0.0, or NaN where the verifier could not decide."""
    return [math.nan if label is None else float(label) for label in labels]


def final_answers(texts: list[str], extract: AnswerExtractor) -> list[str | None]:
    """Each text's final answer by the run's extractor (verifier.answer), as votes and diversity count it (vote_key:
    normalised, spaces removed; None: no answer)."""
    return [vote_key(extract(text)) for text in texts]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): P(at least one of k draws without replacement from n is correct)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _nanmean(x: torch.Tensor) -> float:
    return torch.nanmean(x.float()).item() if x.numel() else math.nan


def group_std(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [P, G] -> [P]: population std over the non-NaN members of each group."""
    centred = rewards - torch.nanmean(rewards, dim=1, keepdim=True)
    return torch.sqrt(torch.nanmean(centred**2, dim=1))


# A group's reward std below this is no spread: the float noise of equal rewards, not a learning signal.
ZERO_SPREAD = 1e-6


def zero_spread_groups(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [P, G] -> [P] bool: the groups whose advantages are all zero (up to float noise), because their
    rewards have no spread or none of them could be scored."""
    return ~(group_std(rewards) >= ZERO_SPREAD)  # NaN (nothing scored) compares False: no spread


def reward_spread(rewards: torch.Tensor, prefix: str) -> dict[str, float]:
    """rewards [P, G]: distribution of per-group mean and std, and the share of groups with no spread."""
    group_mean = torch.nanmean(rewards, dim=1)
    spread = group_std(rewards)
    valid = ~torch.isnan(spread)
    zero_std = (spread[valid] < ZERO_SPREAD).float()
    return {
        f"{prefix}/group_mean/mean": _nanmean(group_mean),
        f"{prefix}/group_std/mean": _nanmean(spread),
        f"{prefix}/group_std/min": spread[valid].min().item() if valid.any() else math.nan,
        f"{prefix}/group_std/max": spread[valid].max().item() if valid.any() else math.nan,
        f"{prefix}/frac_zero_std": _nanmean(zero_std),
    }


def correctness_stats(correct: torch.Tensor) -> dict[str, float]:
    """correct [P, G] of 1/0/NaN: all-correct / all-wrong / mixed groups, pass@k and mean@k for k = 1..G."""
    stats: dict[str, float] = {}
    per_group = []
    for row in correct:
        labels = row[~torch.isnan(row)]
        if labels.numel():
            per_group.append((labels.numel(), int(labels.sum().item())))
    if not per_group:
        return stats
    stats["groups/frac_all_correct"] = sum(c == n for n, c in per_group) / len(per_group)
    stats["groups/frac_all_wrong"] = sum(c == 0 for n, c in per_group) / len(per_group)
    stats["groups/frac_mixed"] = sum(0 < c < n for n, c in per_group) / len(per_group)
    for k in range(1, max(n for n, _ in per_group) + 1):
        eligible = [(n, c) for n, c in per_group if n >= k]
        stats[f"groups/pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible)
    # mean@k: the expected accuracy of one sample, the same for every k (kept for the k the group allows)
    stats["groups/mean@k"] = sum(c / n for n, c in per_group) / len(per_group)
    return stats


def majority_vote_accuracy(answers: list[list[str | None]], correct: torch.Tensor) -> float:
    """Share of groups whose most frequent final answer is a correct one (ties: the first answer seen).

    Votes go by the final answer's text (final_answers: normalised, spaces removed), whatever the labeller: answers the
    labels count as equal but written differently ('0.5', '1/2') vote apart. The vote counts as correct when an
    answer of the winning text was labelled correct (the run's labels, verifier.labels)."""
    hits, counted = 0, 0
    for group_answers, labels in zip(answers, correct.tolist(), strict=True):
        voted = [(a, label) for a, label in zip(group_answers, labels, strict=True) if a is not None]
        if not voted or all(math.isnan(label) for _, label in voted):
            continue
        top = Counter(a for a, _ in voted).most_common(1)[0][0]
        hits += any(a == top and label == 1.0 for a, label in voted)
        counted += 1
    return hits / counted if counted else math.nan


def advantage_stats(advantages: torch.Tensor) -> dict[str, float]:
    """advantages [P, G]: mean |A|, the share exactly zero (no learning signal), mean per-group max - min."""
    return {
        "advantages/mean_abs": advantages.abs().mean().item(),
        "advantages/frac_zero": (advantages == 0).float().mean().item(),
        "advantages/group_range": (advantages.max(dim=1).values - advantages.min(dim=1).values).mean().item(),
    }


def _ngrams(text: str, n: int = 3) -> set[tuple[str, ...]]:
    words = text.split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def ngram_overlap(texts: list[str], n: int = 3) -> float:
    """Mean pairwise Jaccard similarity of word n-gram sets within a group (1: identical, 0: nothing shared)."""
    sets = [_ngrams(t, n) for t in texts]
    pairs = [(a, b) for i, a in enumerate(sets) for b in sets[i + 1 :]]
    scores = [len(a & b) / len(a | b) for a, b in pairs if a | b]
    return sum(scores) / len(scores) if scores else math.nan


def diversity_stats(texts: list[list[str]], answers: list[list[str | None]]) -> dict[str, float]:
    """Within-group diversity: distinct final answers and distinct completions per member, n-gram overlap."""
    distinct_answers = [len({a for a in group if a is not None}) / len(group) for group in answers]
    distinct_texts = [len(set(group)) / len(group) for group in texts]
    overlaps = [o for o in (ngram_overlap(group) for group in texts) if not math.isnan(o)]
    return {
        "diversity/distinct_answers": sum(distinct_answers) / len(distinct_answers),
        "diversity/distinct_completions": sum(distinct_texts) / len(distinct_texts),
        "diversity/ngram_overlap": sum(overlaps) / len(overlaps) if overlaps else math.nan,
    }


def constant_answer_accuracy(references: list[str | None]) -> float:
    """The accuracy of giving every problem one and the same answer, the most common reference (normalised as votes
    are): what a policy that collapsed to a constant answer scores. Near 0 for open answers; for Yes/No, True/False or
    a few labels, the bar a gain must clear to be more than a guess."""
    keys = [key for key in map(vote_key, references) if key is not None]
    return Counter(keys).most_common(1)[0][1] / len(keys) if keys else math.nan


def distinct_answer_share(answers: list[str | None]) -> float:
    """Distinct final answers (normalised) per problem: 1/N when every problem got the same answer."""
    return len({vote_key(a) for a in answers}) / len(answers) if answers else math.nan


def per_task_means(
    tasks: list[str | None], values: list[float], prefix: str, mix: bool | None = None
) -> dict[str, float]:
    """Each task's mean of `values` (NaN left out), as `<prefix>/<task>`, for rows of a mix of tasks (a reasoning-gym
    mix, dataset.tasks); `mix` None: when the rows come from more than one task."""
    named = sorted({task for task in tasks if task is not None})
    if not (len(named) > 1 if mix is None else mix):
        return {}
    means = {}
    for task in named:
        kept = [v for t, v in zip(tasks, values, strict=True) if t == task and not math.isnan(v)]
        means[f"{prefix}/{task}"] = sum(kept) / len(kept) if kept else math.nan
    return means


def length_by_correctness(lengths: torch.Tensor, correct: torch.Tensor) -> dict[str, float]:
    """Mean completion length (tokens) of correct and of incorrect completions."""
    return {
        "completions/length_correct": _nanmean(lengths[correct == 1.0]),
        "completions/length_incorrect": _nanmean(lengths[correct == 0.0]),
    }


def group_statistics(
    rewards: torch.Tensor,
    names: list[str],
    total: torch.Tensor,
    advantages: torch.Tensor,
    correct: torch.Tensor,
    texts: list[list[str]],
    lengths: torch.Tensor,
    extract: AnswerExtractor,
) -> dict[str, float]:
    """All group statistics of one generation batch.

    rewards [P, G, C] per component (NaN: skipped), total [P, G] weighted reward, advantages [P, G],
    correct [P, G] (1/0/NaN), texts [P][G] completions, lengths [P, G] completion tokens; `extract`: the run's answer
    extractor (maj@k, distinct answers).
    """
    stats = reward_spread(total, "groups/reward")
    for index, name in enumerate(names):
        stats |= reward_spread(rewards[:, :, index], f"groups/{name}")
    answers = [final_answers(group, extract) for group in texts]
    stats |= correctness_stats(correct)
    stats["groups/maj@k"] = majority_vote_accuracy(answers, correct)
    stats |= advantage_stats(advantages)
    stats |= diversity_stats(texts, answers)
    stats |= length_by_correctness(lengths, correct)
    return stats


def impute_group_means(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [N, components] (NaN: not scored), N in groups of group_size -> (rewards, imputed mask).

    A component that could not score some members of a group gives them the group's mean of that component: its
    share of their total then moves no member against its group mates (TRL's nansum would count it as 0, a
    penalty). A row that no component scored stays NaN (TRL: unscorable), and so does a component that scored
    no member of the group (math without a reference, selfverify on generation groups)."""
    grouped = rewards.view(-1, group_size, rewards.shape[1])
    mean = torch.nanmean(grouped, dim=1, keepdim=True).expand_as(grouped)
    unscorable = torch.isnan(grouped).all(dim=2, keepdim=True)
    imputed = torch.isnan(grouped) & ~torch.isnan(mean) & ~unscorable
    return torch.where(imputed, mean, grouped).view_as(rewards), imputed.view_as(rewards)


def score_statistics(scores: torch.Tensor, correct: torch.Tensor, prefix: str) -> dict[str, float]:
    """A graded score (the judge's) as a signal, scores and correctness [P, G] (NaN: missing): its mean, its spread
    inside groups (what GRPO can learn from), and its AUROC against the run's correctness labels (NaN unless both
    labels occur among the scored samples)."""
    both = ~torch.isnan(scores) & ~torch.isnan(correct)
    return {
        f"{prefix}/mean": _nanmean(scores),
        f"{prefix}/group_std": _nanmean(group_std(scores)),
        f"{prefix}/auroc": auroc(scores[both].tolist(), [bool(c) for c in correct[both].tolist()]),
    }
