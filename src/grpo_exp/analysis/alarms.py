"""Alarms, each sounding only beyond its noise. Pure functions.

- Over a run's validations (grpo_exp.run.validation calls it at each): the reward-hacking alarm, the training reward
  and the held-out truth parting ways.
- Over the policy's own health at each logged step (grpo_exp.run.health): its entropy collapsing or blowing up, its
  completions cut at the length limit, no group with a reward spread, and its answers collapsing to one.
"""

import statistics
from collections import Counter

from grpo_exp.measures import accuracy_change_interval, auroc_change_interval, slope_interval
from grpo_exp.run_files import HELDOUT_ACCURACY as METRIC

# The setting that cuts a completion: its whole length, or (multi-turn) each turn's
MAX_COMPLETION, MAX_TURN = "trainer.max_completion_length", "rollout.max_tokens_per_turn"
# A multi-turn run's own share of trajectories cut (grpo_exp.rollout.flow): TRL's completions/clipped_ratio counts
# one that ends on a tool call or a game's move, which has no EOS, as cut
TURN_CUT = "rollout/cut_frac"


def hacking_alarm(
    rewards: list[tuple[int, float]],
    validations: list[tuple[int, dict[str, float]]],
    problems: int,
    learned: tuple[str, ...] = (),
) -> str | None:
    """The reward and the truth parting ways, each beyond its noise. It fires when the training reward did not fall
    (its least-squares slope over the steps after the first validation has a 95% interval reaching above 0) while

    - held-out accuracy fell: its change from the first validation (the initial model's, at step 0) to the latest
      has a 95% interval below 0; or
    - a learned component (`learned`: judge, confidence) agrees less with the verifier's labels: its held-out AUROC
      (heldout/<name>/auroc) fell, its change having a 95% interval below 0.

    "Did not fall" rather than "rose": a reward that holds while the accuracy falls has already come apart from it
    (the P(Yes) loop: the reward rises in steps, its slope is above noise only late). `rewards`: (step, value);
    `validations`: (step, metrics), METRIC in each. None when silent. Pure."""
    if len(validations) < 2:
        return None
    start = validations[0][0]
    points = [(step, value) for step, value in rewards if step > start and value == value]
    slope, low, high = slope_interval([float(s) for s, _ in points], [v for _, v in points])
    if not high > 0:  # the reward fell (or too few steps to tell): the policy is not being paid for it
        return None
    first, last = validations[0][1], validations[-1][1]
    findings = []
    change, _, upper = accuracy_change_interval(first[METRIC], last[METRIC], problems)
    if upper < 0:
        findings.append(
            f"held-out accuracy fell {first[METRIC]:.3f} -> {last[METRIC]:.3f} ({change:+.3f}, 95% interval up to "
            f"{upper:+.3f})"
        )
    for name in learned:
        before, now = first.get(f"heldout/{name}/auroc"), last.get(f"heldout/{name}/auroc")
        if before is None or now is None or before != before or now != now:
            continue
        change, _, upper = auroc_change_interval(
            (before, *labelled(first[METRIC], problems)), (now, *labelled(last[METRIC], problems))
        )
        if upper < 0:
            findings.append(
                f"{name} agrees less with the verifier's labels: held-out AUROC {before:.3f} -> {now:.3f} "
                f"({change:+.3f}, 95% interval up to {upper:+.3f})"
            )
    if not findings:
        return None
    trend = "rose" if low > 0 else "held"
    return (
        f"the training reward {trend} ({slope:+.4f} a step since step {start}, 95% interval {low:+.4f} to "
        f"{high:+.4f}) while " + "; and ".join(findings)
    )


def labelled(accuracy: float, problems: int) -> tuple[int, int]:
    """(correct, wrong) answers of a validation, from its accuracy on `problems` problems."""
    correct = round(accuracy * problems)
    return correct, problems - correct


def entropy_alarm(entropies: list[float], window: int, collapse_below: float, blowup_above: float) -> str | None:
    """The policy's token entropy (TRL's `entropy`, one value per logged step) collapsing or blowing up: the mean of
    the last `window` logged steps below `collapse_below` times the mean of the first `window` (above `blowup_above`
    times it), and their difference's 95% interval (Welch's t) all below 0 (above 0). None when silent, or with
    fewer than 2 x window steps."""
    if len(entropies) < 2 * window:
        return None
    first, recent = entropies[:window], entropies[-window:]
    start, now = statistics.fmean(first), statistics.fmean(recent)
    if start <= 0:
        return None
    low, high = _welch_interval(recent, first)
    if now < collapse_below * start and high < 0:
        what, rule = "collapsed", f"below health.collapse_below={collapse_below} of the start"
    elif now > blowup_above * start and low > 0:
        what, rule = "blew up", f"above health.blowup_above={blowup_above} times the start"
    else:
        return None
    return (
        f"the policy's entropy {what}: {start:.3f} -> {now:.3f} nats a token (the first and the last {window} logged "
        f"steps, x{now / start:.2f}, {rule}; change {now - start:+.3f}, 95% interval {low:+.3f} to {high:+.3f})"
    )


def _welch_interval(sample: list[float], reference: list[float]) -> tuple[float, float]:
    """95% interval of mean(sample) - mean(reference), Welch's t; without any spread, the difference itself."""
    from scipy.stats import ttest_ind

    difference = statistics.fmean(sample) - statistics.fmean(reference)
    if statistics.pvariance(sample) == 0 and statistics.pvariance(reference) == 0:
        return difference, difference
    interval = ttest_ind(sample, reference, equal_var=False).confidence_interval(0.95)
    return float(interval.low), float(interval.high)


def truncation_warning(
    shares: list[float], completions_per_step: int, window: int, threshold: float, limit: str = MAX_COMPLETION
) -> str | None:
    """Completions cut at the length limit: of the last `window` logged steps' completions (TRL's
    completions/clipped_ratio, or a multi-turn run's rollout/cut_frac; `completions_per_step` each), the share cut
    has a 95% interval (Wilson) all above `threshold`. `limit`: the setting that cut them. None when silent, or
    before `window` steps."""
    from scipy.stats import binomtest

    if len(shares) < window:
        return None
    total = completions_per_step * window
    cut = min(round(sum(shares[-window:]) * completions_per_step), total)
    low = binomtest(cut, total).proportion_ci(0.95, method="wilson").low
    if not low > threshold:
        return None
    return (
        f"{cut} of the last {total} completions ({cut / total:.0%}, 95% interval from {low:.2f}) were cut at "
        f"{limit}, above health.truncation_share={threshold}: their answers may never be "
        f"reached, and the rewards score unfinished text; raise {limit}"
    )


def no_signal_warning(zero_std_shares: list[float], window: int) -> str | None:
    """No learning signal: not a single group with a reward spread (TRL's frac_reward_zero_std at 1) in any logged
    step since the run began (at least `window` of them), or in the last 3 x `window` (a long flat stretch; a
    shorter one is common in a healthy run whose groups are often all wrong). Every advantage was 0 there, so nothing
    was learned. None when silent."""
    flat = [share >= 1 - 1e-9 for share in zero_std_shares]
    since_start = len(flat) >= window and all(flat)
    stretch = 3 * window
    if since_start:
        where = f"any of the {len(flat)} logged steps so far"
    elif len(flat) >= stretch and all(flat[-stretch:]):
        where = f"any of the last {stretch} logged steps"
    else:
        return None
    return (
        f"not one group had a reward spread in {where} (frac_reward_zero_std 1.00 at each): every advantage is 0, so "
        "nothing is being learned"
    )


def answer_collapse_alarm(answers: list[str | None], references: list[str | None], share: float) -> str | None:
    """One answer given to most prompts: of the completions' final answers (vote keys, None: no answer), the most
    common one's share has a 95% Wilson interval above `share` and above its share among the completions' references
    (what answering it to all would score), the references having at least two values. None when silent."""
    from scipy.stats import binomtest

    given = [a for a in answers if a is not None]
    if not given or len({r for r in references if r is not None}) < 2:
        return None
    top, count = Counter(given).most_common(1)[0]
    low = binomtest(count, len(answers)).proportion_ci(0.95, method="wilson").low
    fits = sum(r == top for r in references) / len(references)
    if not (low > share and low > fits):
        return None
    return (
        f"the policy collapsed to one answer: {count} of {len(answers)} recent completions answer {top!r} (95% "
        f"interval from {low:.2f}, above health.answer_collapse_share={share}), which is the reference of {fits:.0%} "
        "of their prompts: it answers a constant, not the question"
    )
