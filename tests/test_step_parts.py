"""The step-parts benchmark's accounting (benchmarks.step_parts): per-step seconds between snapshots, "other" under
each part with parts within it, and the tree it prints."""

import pytest

from benchmarks.step_parts import per_step, tree_lines, turn_lines


def test_per_step_divides_the_difference_and_adds_what_each_part_spent_outside_its_parts():
    before = {("generation",): 2.0, ("generation", "decoding"): 1.0}
    after = {("generation",): 12.0, ("generation", "decoding"): 7.0, ("generation", "rewards"): 1.0, ("loss",): 4.0}
    seconds = per_step(after, before, steps=2)
    assert seconds == pytest.approx(
        {
            ("generation",): 5.0,
            ("generation", "decoding"): 3.0,
            ("generation", "rewards"): 0.5,
            ("generation", "other"): 1.5,
            ("loss",): 2.0,
        }
    )


def test_the_tree_nests_parts_under_their_parent_largest_first_with_the_steps_rest_last():
    seconds = {("generation",): 5.0, ("generation", "rewards"): 0.5, ("generation", "decoding"): 3.0}
    seconds[("generation", "other")] = 1.5
    seconds[("loss",)] = 2.0
    lines = tree_lines(10.0, seconds)
    labels = [line[:60].rstrip() for line in lines]
    assert labels == [
        "the step (TRL step_time)",
        "  generation",
        "    decoding",
        "    rewards",
        "    other",
        "  loss",
        "  other (the loss backward)",
    ]
    assert lines[-1].split()[-2:] == ["3.000", "30%"]


def test_turn_lines_give_each_turns_trajectories_and_its_last_end_averaged_over_rollouts():
    rollouts = [{1: [0.5, 1.0], 2: [2.0]}, {1: [1.0, 3.0]}]
    lines = turn_lines(rollouts)
    assert lines[0].split()[2] == "2.0" and lines[0].endswith("2.00 s")  # (1.0 + 3.0) / 2
    assert lines[1].split()[2] == "0.5" and lines[1].endswith("2.00 s")
