"""Group statistics against hand-computed values on small tensors."""

import math

import pytest
import torch

from grpo_exp.measures import exact_sign_test, mean_interval, paired_differences
from grpo_exp.stats import (
    advantage_stats,
    correctness_stats,
    diversity_stats,
    final_answers,
    group_statistics,
    length_by_correctness,
    majority_vote_accuracy,
    ngram_overlap,
    pass_at_k,
    reward_spread,
)
from grpo_exp.text import stated_answer

nan = math.nan


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong answers: always a hit


def test_reward_spread_of_groups_of_two_with_a_skipped_sample():
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5], [1.0, nan]])
    stats = reward_spread(rewards, "r")
    # group means 0.5, 0.5, 1.0; population stds 0.5, 0, 0 (the NaN member is left out)
    assert stats["r/group_mean/mean"] == pytest.approx(2 / 3)
    assert stats["r/group_std/mean"] == pytest.approx(0.5 / 3)
    assert stats["r/group_std/max"] == 0.5 and stats["r/group_std/min"] == 0.0
    assert stats["r/frac_zero_std"] == pytest.approx(2 / 3)


def test_groups_of_size_one_have_no_spread():
    stats = reward_spread(torch.tensor([[1.0], [0.0]]), "r")
    assert stats["r/frac_zero_std"] == 1.0 and stats["r/group_std/mean"] == 0.0
    assert correctness_stats(torch.tensor([[1.0], [0.0]]))["groups/pass@1"] == 0.5


def test_correctness_stats_hand_computed():
    correct = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [nan, nan, nan]])
    stats = correctness_stats(correct)
    assert stats["groups/frac_all_correct"] == pytest.approx(1 / 3)
    assert stats["groups/frac_all_wrong"] == pytest.approx(1 / 3)
    assert stats["groups/frac_mixed"] == pytest.approx(1 / 3)
    assert stats["groups/pass@1"] == pytest.approx((1 + 0 + 1 / 3) / 3)
    assert stats["groups/pass@2"] == pytest.approx((1 + 0 + (1 - 1 / 3)) / 3)  # 1 - C(2,2)/C(3,2)
    assert stats["groups/pass@3"] == pytest.approx(2 / 3)
    assert stats["groups/mean@k"] == pytest.approx((1 + 0 + 1 / 3) / 3)
    assert correctness_stats(torch.full((2, 2), nan)) == {}


def test_majority_vote():
    answers = [["4", "4", "5"], ["7", "8", "8"], [None, None, None]]
    correct = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert majority_vote_accuracy(answers, correct) == 0.5  # group 1 right, group 2 wrong, group 3 no answers


def test_advantage_stats():
    stats = advantage_stats(torch.tensor([[1.0, -1.0], [0.0, 0.0]]))
    assert stats == {"advantages/mean_abs": 0.5, "advantages/frac_zero": 0.5, "advantages/group_range": 1.0}


def test_diversity_and_overlap():
    assert ngram_overlap(["a b c d", "a b c d"]) == 1.0
    assert ngram_overlap(["a b c d", "x y z w"]) == 0.0
    assert math.isnan(ngram_overlap(["a b c d"]))
    stats = diversity_stats([["a b c", "a b c"], ["x", "y"]], [["1", "1"], ["2", None]])
    assert stats["diversity/distinct_answers"] == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert stats["diversity/distinct_completions"] == pytest.approx((1 / 2 + 1) / 2)
    assert stats["diversity/ngram_overlap"] == 1.0  # only the first group has 3-grams


def test_length_by_correctness_and_final_answer():
    stats = length_by_correctness(torch.tensor([[10.0, 20.0], [30.0, 40.0]]), torch.tensor([[1.0, 0.0], [nan, 0.0]]))
    assert stats == {"completions/length_correct": 10.0, "completions/length_incorrect": 30.0}
    assert final_answers(["so \\boxed{ 1 2 } ok", "it is 1,234 then 5.5", "none"], stated_answer) == ["12", "5.5", None]


def test_group_statistics_composes_everything():
    rewards = torch.tensor([[[1.0, 0.2], [0.0, 0.2]], [[0.0, 0.0], [0.0, nan]]])
    total = rewards[:, :, 0] + rewards[:, :, 1].nan_to_num()
    stats = group_statistics(
        rewards,
        ["math", "format"],
        total,
        torch.tensor([[1.0, -1.0], [0.0, 0.0]]),
        torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
        [["\\boxed{3}", "\\boxed{4}"], ["5", "5"]],
        torch.tensor([[5.0, 7.0], [9.0, 11.0]]),
        stated_answer,
    )
    assert stats["groups/math/frac_zero_std"] == 0.5
    assert stats["groups/format/group_mean/mean"] == pytest.approx(0.1)
    assert stats["groups/pass@2"] == 0.5 and stats["groups/maj@k"] == 0.5
    assert stats["completions/length_correct"] == 5.0


def test_mean_interval_is_student_t_over_the_values():
    # 1, 2, 3: mean 2, sample sd 1; t(97.5%, 2 df) = 4.3027 (a table): half-width 4.3027 / sqrt(3) = 2.4841
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and low == pytest.approx(2 - 2.4841, abs=1e-4) and high == pytest.approx(2 + 2.4841, abs=1e-4)
    # 0.5, 0.7: sample sd 0.1414; t(95%, 1 df) = 6.3138: half-width 6.3138 * 0.1414 / sqrt(2) = 0.6314
    assert mean_interval([0.5, 0.7], level=0.90)[2] == pytest.approx(0.6 + 0.6314, abs=1e-4)
    assert mean_interval([0.4, 0.4]) == (0.4, 0.4, 0.4)  # no spread: nothing to be unsure of


def test_mean_interval_of_one_value_has_no_interval_and_of_none_no_mean():
    mean, low, high = mean_interval([0.7])
    assert mean == 0.7 and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(x) for x in mean_interval([]))


def test_paired_differences_keep_the_keys_both_have():
    assert paired_differences({"42": 0.5, "43": 0.6, "44": 0.7}, {"43": 0.7, "42": 0.55}) == pytest.approx([0.05, 0.1])
    assert paired_differences({"42": 0.5}, {"43": 0.7}) == []


def test_the_exact_sign_test_counts_the_pairs_that_differ_and_leaves_ties_and_nans_out():
    above, below, p = exact_sign_test([1, -1, -1, -1, -1, 0, 0, nan])
    assert (above, below) == (1, 4)
    assert p == pytest.approx(2 * (1 + 5) / 2**5)  # two-sided: P(<= 1 of 5) twice
    assert exact_sign_test([0, 0]) == (0, 0, 1.0)
    assert exact_sign_test([-1] * 14 + [1] * 5)[2] == pytest.approx(0.0636, abs=1e-4)  # docs/async.md, seed 43


def test_the_paired_report_sets_each_arm_against_the_baseline_seed_by_seed_and_problem_by_problem(capsys):
    from benchmarks.time_to_accuracy import ARMS, report_paired

    def run(arm, seed, correct):
        accuracy = sum(c or 0 for c in correct) / len(correct)
        return {"arm": arm, "seed": seed, "accuracy_after": accuracy, "correct_after": correct}

    results = [
        run("vllm_server", 42, [1, 1, 0, 0]),
        run("async1", 42, [1, 0, 0, 0]),
        run("vllm_server", 43, [1, 0, 1, 0]),
        run("async1", 43, [1, 0, 1, None]),  # an undecided answer pairs with nothing
        run("async2", 44, [0, 0, 0, 0]),  # no synchronous run of its seed: left out
    ]
    report_paired(results, ["vllm_server", "async1", "async2"], "vllm_server")
    printed = capsys.readouterr().out
    assert "async1 (generation=vllm_async) against vllm_server" in printed and ARMS["async1"]
    assert "seed 42: vllm_server 0.50, async1 0.25, difference -0.25" in printed
    assert "over 2 seeds: mean difference" in printed
    assert "over 7 (seed, problem) pairs: -0.143" in printed and "0 better, 1 worse: exact sign test p = 1" in printed
    assert "async2" not in printed.split("against vllm_server")[-1]


def test_against_a_repeated_baseline_each_seeds_run_is_the_unit():
    from grpo_exp.measures import against_repeated_baseline

    baseline = {42: 0.40, 43: 0.50, 44: 0.60}
    repeat = {42: 0.44, 43: 0.46, 44: 0.60}
    other = {42: 0.32, 43: 0.43, 45: 0.90}  # seed 44 has no run of it, 45 no baseline: both left out
    (mean, low, high), (noise, noise_low, noise_high) = against_repeated_baseline(baseline, repeat, other)
    assert mean == pytest.approx(((0.32 - 0.42) + (0.43 - 0.48)) / 2)  # each against its seed's two runs' mean
    assert low < mean < high
    assert noise == pytest.approx(0.0)  # +0.04 and -0.04: the runs of one seed part both ways
    assert noise_low == pytest.approx(-noise_high)
    (mean, low, _), _ = against_repeated_baseline(baseline, repeat, {42: 0.5})
    assert mean == pytest.approx(0.08) and math.isnan(low)  # one seed: no interval


def test_the_report_against_a_repeat_names_both_differences_by_run(capsys):
    from benchmarks.time_to_accuracy import report_against_repeat

    results = [
        {"arm": arm, "seed": seed, "accuracy_after": accuracy}
        for arm, seed, accuracy in [
            ("vllm_server", 42, 0.40), ("vllm_server_again", 42, 0.44), ("async1", 42, 0.32),
            ("vllm_server", 43, 0.50), ("vllm_server_again", 43, 0.46), ("async1", 43, 0.43),
        ]
    ]  # fmt: skip
    report_against_repeat(results, ["vllm_server", "vllm_server_again", "async1"], "vllm_server", "vllm_server_again")
    printed = capsys.readouterr().out
    heading = "async1 against the mean of vllm_server and vllm_server_again (two runs of each seed), seeds [42, 43]:"
    assert heading in printed and "-0.075, 95% t interval" in printed
    assert "vllm_server_again - vllm_server (two runs of one setting): +0.000" in printed


def test_a_repeat_without_the_arm_it_repeats_is_refused_naming_both_flags(capsys):
    from benchmarks.time_to_accuracy import main

    with pytest.raises(SystemExit) as stopped:
        main(["--arms", "vllm_server", "vllm_server_again", "--repeat", "vllm_server_again"])
    assert stopped.value.code == 2
    assert "--repeat vllm_server_again: give --paired ARM too" in capsys.readouterr().err


def test_the_sampling_law_check_passes_draws_of_the_law_and_flags_a_sampler_that_never_draws_the_tail():
    """benchmarks.sampling_law's count by bands: draws of the distribution itself match it; draws from the same
    distribution with every token below 1e-7 left out (vLLM's float32 race) show that band short."""
    import numpy as np

    from benchmarks.sampling_law import law_check

    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, 50_001) ** 2  # a long tail: the last ~47,000 tokens below 1e-7
    p /= p.sum()
    exact = law_check(rng.multinomial(2_000_000, p).astype(float), p)
    assert exact["p"] > 1e-3 and all(abs(band["z"]) < 4 for band in exact["bands"])
    truncated = np.where(p < 1e-7, 0.0, p)
    short = law_check(rng.multinomial(2_000_000, truncated / truncated.sum()).astype(float), p)
    tail = short["bands"][-1]
    assert tail["band"] == "p in [0, 1e-07)" and tail["observed"] == 0 and tail["z"] < -10
    assert short["p"] < 1e-10
