"""A reward plug-in for multi-process tests: groups with a spread on the first process only."""

import os


def spread_on_the_first_process(completions, **kwargs):
    """1 for every other completion on the process of rank 0, 0 elsewhere: with one group per process, every step
    has one group with a spread (kept) and one without (left out by zero_variance_groups=skip)."""
    first = int(os.environ.get("RANK", "0")) == 0
    return [float(first and i % 2 == 0) for i in range(len(completions))]
