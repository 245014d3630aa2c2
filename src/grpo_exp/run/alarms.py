"""Alarms over a run's validations: the reward-hacking alarm (the training reward and the held-out truth parting
ways, each beyond its noise). Pure functions; grpo_exp.run.validation calls them at each validation."""

from grpo_exp.run.kept_models import METRIC
from grpo_exp.stats import accuracy_change_interval, auroc_change_interval, slope_interval


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
