"""Reward plug-ins for tests whose steps must train whatever the model writes: groups with a spread by rule."""

import os


def spread_on_the_first_process(completions, **kwargs):
    """1 for every other completion on the process of rank 0, 0 elsewhere: with one group per process, every step
    has one group with a spread (kept) and one without (left out by zero_variance_groups=skip)."""
    first = int(os.environ.get("RANK", "0")) == 0
    return spread_in_every_group(completions) if first else [0.0] * len(completions)


def spread_in_every_group(completions, **kwargs):
    """1 for every other completion, 0 for the rest, on every process: with groups of an even size, every group has a
    spread whatever its completions say, so that every step trains."""
    return [float(i % 2 == 0) for i in range(len(completions))]
