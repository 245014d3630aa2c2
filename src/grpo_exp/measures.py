"""Measures on plain lists, and the intervals and tests that compare runs, validations and arms: AUROC, balanced
accuracy, a bootstrap; slopes, accuracies and AUROCs with their intervals; means over seeds, paired changes, the sign
test, Wilson's interval. Pure Python, scipy's t and binomial distributions where needed, and no torch: the analysis
commands (compare, diagnose) and the benchmarks read them without loading it. The statistics of a step's groups, on
tensors, are grpo_exp.stats's.
"""

import math
import random


def auroc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), ties count half
    (Mann-Whitney, from average ranks: n log n, so that a bootstrap over hundreds of samples stays cheap)."""
    positives = sum(bool(y) for y in labels)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return math.nan
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):  # tied scores share the mean of their ranks (1-based)
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2 + 1
        start = end + 1
    rank_sum = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def bootstrap_interval(
    scores: list[float], labels: list[bool], statistic, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of statistic(scores, labels), resampling (score, label) pairs with a seed."""
    rng = random.Random(seed)
    n, values = len(scores), []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        value = statistic([scores[i] for i in picks], [labels[i] for i in picks])
        if not math.isnan(value):
            values.append(value)
    if not values:
        return math.nan, math.nan
    values.sort()
    tail = (1 - level) / 2
    return values[int(tail * (len(values) - 1))], values[math.ceil((1 - tail) * (len(values) - 1))]


def balanced_accuracy(predicted_yes: list[bool], actual_yes: list[bool]) -> float:
    """The mean of the recall of "Yes" and of "No": 0.5 for any constant verdict, whatever the labels' balance
    (NaN unless both labels occur)."""
    recalls = []
    for label in (True, False):
        members = [p for p, a in zip(predicted_yes, actual_yes, strict=True) if a == label]
        if not members:
            return math.nan
        recalls.append(sum(p == label for p in members) / len(members))
    return sum(recalls) / len(recalls)


def slope_interval(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """The least-squares slope of ys on xs and its 95% interval (Student t, n - 2 degrees of freedom); NaNs with
    fewer than 3 points or no spread in xs."""
    from scipy.stats import t

    n = len(xs)
    mean_x, mean_y = (sum(xs) / n, sum(ys) / n) if n else (0.0, 0.0)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if n < 3 or spread == 0:
        return math.nan, math.nan, math.nan
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True)) / (n - 2)
    half = t.ppf(0.975, n - 2) * math.sqrt(residual / spread)
    return slope, slope - half, slope + half


def accuracy_standard_error(accuracy: float, problems: int) -> float:
    """The binomial standard error of an accuracy measured on `problems` problems (Laplace-smoothed, so that 0 and 1
    still carry their uncertainty)."""
    smoothed = (accuracy * problems + 1) / (problems + 2)
    return math.sqrt(smoothed * (1 - smoothed) / problems)


def accuracy_change_interval(first: float, last: float, problems: int) -> tuple[float, float, float]:
    """last - first, two accuracies each measured on `problems` problems, and its 95% interval (normal
    approximation; accuracy_standard_error's)."""
    error = math.hypot(accuracy_standard_error(first, problems), accuracy_standard_error(last, problems))
    change = last - first
    return change, change - 1.96 * error, change + 1.96 * error


def auroc_standard_error(area: float, positives: int, negatives: int) -> float:
    """The standard error of an AUROC from `positives` and `negatives` samples (Hanley & McNeil 1982, Radiology
    143:29-36: the exponential approximation of its two variance terms); NaN without both classes."""
    if positives < 1 or negatives < 1:
        return math.nan
    q1, q2 = area / (2 - area), 2 * area**2 / (1 + area)
    variance = area * (1 - area) + (positives - 1) * (q1 - area**2) + (negatives - 1) * (q2 - area**2)
    return math.sqrt(max(variance, 0.0) / (positives * negatives))


def auroc_change_interval(first: tuple[float, int, int], last: tuple[float, int, int]) -> tuple[float, float, float]:
    """The change of an AUROC measured twice on independent samples, each (area, positives, negatives), and its 95%
    interval (normal approximation, Hanley & McNeil's standard errors); NaNs where either lacks a class."""
    error = math.hypot(auroc_standard_error(*first), auroc_standard_error(*last))
    change = last[0] - first[0]
    return change, change - 1.96 * error, change + 1.96 * error


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """The mean of values (one per seed, say) and its interval (Student t, n - 1 degrees of freedom: a handful of
    seeds is far from the normal limit). The interval is NaN with fewer than 2 values (one value has no spread
    to estimate), and everything is NaN with none."""
    from scipy.stats import t

    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sample_sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t.ppf((1 + level) / 2, n - 1) * sample_sd / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_differences(baseline: dict, other: dict) -> list[float]:
    """other[key] - baseline[key] for the keys (seeds, say) both have, in baseline's order: the differences a
    paired comparison rests on (a key in one of them only has nothing to pair with)."""
    return [other[key] - baseline[key] for key in baseline if key in other]


def against_repeated_baseline(
    baseline: dict, repeat: dict, other: dict
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Where the baseline was run twice for each key (seed), `repeat` being its second run: the mean of other -
    (baseline + repeat) / 2 over the keys all three have, with its 95% t interval; and the same of repeat - baseline,
    how far two runs of one setting end apart (the noise a difference must stand out of). Each run, not each
    problem, is the unit: two runs of one seed part after their first steps, so problems paired within a seed are
    not independent draws."""
    keys = [key for key in baseline if key in repeat and key in other]
    versus_both = [other[key] - (baseline[key] + repeat[key]) / 2 for key in keys]
    return mean_interval(versus_both), mean_interval([repeat[key] - baseline[key] for key in keys])


def wilson_interval(successes: int, total: int) -> tuple[float, float]:
    """The 95% Wilson interval of a rate of `successes` in `total`; NaNs for none."""
    from scipy.stats import binomtest

    if total < 1:
        return math.nan, math.nan
    interval = binomtest(successes, total).proportion_ci(0.95, method="wilson")
    return float(interval.low), float(interval.high)


def paired_change(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """The mean of after - before over paired measurements (the same problems), and its 95% interval (Student t);
    differences all equal: the interval is the value itself (no noise to estimate). NaNs with none."""
    differences = [a - b for b, a in zip(before, after, strict=True)]
    if differences and len(set(differences)) == 1:
        return differences[0], differences[0], differences[0]
    return mean_interval(differences)


def exact_sign_test(differences: list[float]) -> tuple[int, int, float]:
    """How many paired differences are above 0 and below it, and the two-sided exact sign test's p-value on them
    (ties, and NaNs, left out; 1.0 with none)."""
    from scipy.stats import binomtest

    above = sum(1 for d in differences if d > 0)
    below = sum(1 for d in differences if d < 0)
    return above, below, float(binomtest(above, above + below).pvalue) if above + below else 1.0


def problems_to_resolve(before: list[float], after: list[float]) -> int | None:
    """How many paired problems would put the observed mean change's 95% interval clear of 0, its per-problem spread
    as observed (n = (1.96 sd / mean)^2); None where no change was observed."""
    differences = [a - b for b, a in zip(before, after, strict=True)]
    if len(differences) < 2:
        return None
    mean = sum(differences) / len(differences)
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1))
    if mean == 0 or sd == 0:
        return None
    return math.ceil((1.96 * sd / abs(mean)) ** 2)


def quarter_means(values: list[float]) -> tuple[float, float]:
    """Means of the first and the last quarter of a series (at least one value each); NaN when empty."""
    if not values:
        return math.nan, math.nan
    window = max(1, len(values) // 4)
    return sum(values[:window]) / window, sum(values[-window:]) / window
