"""trainer.zero_variance_groups: groups with no reward spread left out of the loss (skip) or replaced by groups of
fresh prompts (resample). TRL's GRPOTrainer really generates, scores and computes its loss here (tiny model)."""

import pytest
import torch
from trl import GRPOTrainer

from grpo_exp.stats import zero_spread_groups
from grpo_exp.trainer.trl_batch import INFORMATIVE, concatenate, loss_scale, select_rows
from grpo_exp.trainer.zero_variance import fresh_inputs, informative_loss, topped_up
from support.config import TINY_RUN
from tests.helpers.cli import logged_steps, run_cli
from tests.helpers.tiny_trainer import G, Recording, generation_batch, logged, make_trainer

RESAMPLE_METRICS = (
    "resample/batches",
    "resample/bound_hit",
    "resample/groups_dropped",
    "zero_variance/groups_left_out",
)


def first_group_flat(completions, **kwargs):
    """No spread in the first group of each batch (every member 0.5); members 0..3 in the others."""
    return [0.5 if i < G else float(i % G) for i in range(len(completions))]


def first_two_groups_flat(completions, **kwargs):
    return [0.5 if i < 2 * G else float(i % G) for i in range(len(completions))]


def flat(completions, **kwargs):
    return [1.0] * len(completions)


def spread_for_odd_questions(completions, question, **kwargs):
    """A spread only for the prompts whose question has an odd length: about half the groups are dead."""
    return [float(i % G) if len(q) % 2 else 0.0 for i, q in enumerate(question)]


def gradient(trainer: Recording, batch: dict) -> tuple[torch.Tensor, list[int]]:
    """The gradient of the trainer's loss on `batch` (flattened) and the batch sizes the model's forward saw."""
    seen = []
    handle = trainer.model.register_forward_pre_hook(
        lambda m, args, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    trainer.model.zero_grad(set_to_none=True)
    trainer.compute_loss(trainer.model, batch).backward()
    handle.remove()
    grads = [p.grad.flatten() for p in trainer.model.parameters()]  # every parameter has one (None would fail)
    return torch.cat(grads), seen


LOSS_TYPES = ["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo"]


@pytest.fixture(scope="module")
def first_group_flat_batch(tmp_path_factory):
    """One skipping trainer and its batch (3 groups, the first without spread) for every loss type: TRL reads its
    loss_type when it computes the loss, nothing of the batch depends on it (test_mismatch switches it so too)."""
    trainer = make_trainer(tmp_path_factory.mktemp("first_group_flat"), first_group_flat, "skip")
    return trainer, generation_batch(trainer, prompts=3)


@pytest.fixture(scope="module")
def first_two_groups_flat_batch(tmp_path_factory):
    """The same with 4 groups, the first two without spread."""
    trainer = make_trainer(tmp_path_factory.mktemp("first_two_flat"), first_two_groups_flat, "skip", prompts=4)
    return trainer, generation_batch(trainer, prompts=4)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_skip_gives_trls_update_without_the_forward_of_no_spread_groups(first_group_flat_batch, loss_type):
    trainer, batch = first_group_flat_batch
    trainer.loss_type, batch = loss_type, dict(batch)
    assert batch[INFORMATIVE].tolist() == [False] * G + [True] * 2 * G

    skipped, seen_skipping = gradient(trainer, batch)
    kept = {k: v for k, v in batch.items() if k != INFORMATIVE}  # TRL's own loss over every row
    full, seen_full = gradient(trainer, kept)
    assert seen_full == [3 * G] and seen_skipping == [2 * G]
    assert full.abs().max() > 0
    torch.testing.assert_close(skipped, full, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_under_several_processes_skip_takes_as_many_rows_as_the_busiest_process_and_gives_trls_update(
    first_two_groups_flat_batch, loss_type
):
    """Another process kept one group more: this one tops its rows up with a left-out group (advantages zeroed),
    so that every process hands TRL as many rows (TRL gathers per-row metrics), and the update is still TRL's."""
    trainer, batch = first_two_groups_flat_batch
    trainer.loss_type, batch = loss_type, dict(batch)
    assert batch[INFORMATIVE].tolist() == [False] * 2 * G + [True] * 2 * G

    def trl_loss(rows, items=None):
        return GRPOTrainer.compute_loss(trainer, trainer.model, rows, False, items)

    seen = []
    handle = trainer.model.register_forward_pre_hook(
        lambda m, args, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    trainer.model.zero_grad(set_to_none=True)
    informative_loss(batch, loss_type, trl_loss, None, most_rows=lambda rows: rows + G).backward()
    handle.remove()
    topped = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    full, _ = gradient(trainer, {k: v for k, v in batch.items() if k != INFORMATIVE})
    assert seen == [3 * G] and full.abs().max() > 0
    torch.testing.assert_close(topped, full, rtol=1e-4, atol=1e-7)


def test_topping_up_adds_the_first_left_out_rows_only():
    keep = torch.tensor([False, True, False, False, True])
    assert topped_up(keep, 4).tolist() == [True, True, True, False, True]
    assert topped_up(keep, 2).tolist() == keep.tolist() and topped_up(keep, 9).all()
    assert keep.tolist() == [False, True, False, False, True]  # not modified in place


def test_a_batch_with_no_spread_at_all_takes_no_forward_and_gives_zero_gradients(tmp_path):
    trainer = make_trainer(tmp_path, flat, "skip")
    batch = generation_batch(trainer, prompts=3)
    assert not batch[INFORMATIVE].any()
    grads, seen = gradient(trainer, batch)
    assert seen == [] and grads.abs().max() == 0  # zero, not missing: the optimiser steps as TRL's would


def test_under_normalize_then_sum_skip_also_gives_trls_update(tmp_path):
    # advantages normalised over the batch: a group is left out only where they are zero too
    trainer = make_trainer(
        tmp_path, first_group_flat, "skip", overrides=["+trainer.extra.multi_objective_aggregation=normalize_then_sum"]
    )
    batch = generation_batch(trainer, prompts=3)
    assert batch[INFORMATIVE].tolist() == [False] * G + [True] * 2 * G
    skipped, _ = gradient(trainer, batch)
    full, _ = gradient(trainer, {k: v for k, v in batch.items() if k != INFORMATIVE})
    torch.testing.assert_close(skipped, full, rtol=1e-4, atol=1e-7)


def test_with_a_kl_term_skip_leaves_no_group_out(tmp_path):
    # beta > 0: a row with zero advantage still adds its KL term, so leaving it out would change the update
    trainer = make_trainer(tmp_path, first_group_flat, "skip", overrides=["trainer.beta=0.04"])
    assert INFORMATIVE not in generation_batch(trainer, prompts=3)


def test_keep_marks_nothing(tmp_path):
    batch = generation_batch(make_trainer(tmp_path, first_group_flat, "keep"), prompts=3)
    assert INFORMATIVE not in batch


def test_resample_fills_the_step_with_groups_that_have_a_spread(tmp_path):
    trainer = make_trainer(tmp_path, spread_for_odd_questions, "resample", prompts=2, max_resample_batches=8)
    trainer.train()  # 2 steps of the debug trainer
    metrics = {key: logged(trainer, key) for key in RESAMPLE_METRICS}
    per_step = metrics["resample/batches"]
    assert len(per_step) == 2 and len(trainer.batches) == sum(per_step)  # every generated batch was described
    assert metrics["resample/bound_hit"] == [0.0, 0.0]
    assert metrics["zero_variance/groups_left_out"] == [0.0, 0.0]
    # each step generated until it had 2 groups with a spread, and dropped the rest
    with_spread = [int((~zero_spread_groups(b.grouped(b.total))).sum()) for b in trainer.batches]
    first, second = with_spread[: int(per_step[0])], with_spread[int(per_step[0]) :]
    for step in (first, second):
        assert sum(step) >= 2 and sum(step[:-1]) < 2
    assert metrics["resample/groups_dropped"] == [2.0 * len(first) - 2, 2.0 * len(second) - 2]


def test_resample_stops_at_its_bound_and_trains_on_what_it_has(tmp_path):
    trainer = make_trainer(tmp_path, flat, "resample", prompts=2, max_resample_batches=2)
    trainer.train()
    metrics = {key: logged(trainer, key) for key in RESAMPLE_METRICS}
    assert metrics["resample/batches"] == [3.0, 3.0]  # the first batch and 2 more, each step
    assert metrics["resample/bound_hit"] == [1.0, 1.0]
    assert metrics["resample/groups_dropped"] == [4.0, 4.0]
    assert metrics["zero_variance/groups_left_out"] == [2.0, 2.0]  # the step's 2 groups, no forward for either
    assert len(trainer.batches) == 6


def test_resampled_prompts_are_drawn_from_the_seed_and_step(tmp_path):
    trainer = make_trainer(tmp_path, flat, "resample", prompts=2)

    def draw(groups: int, attempt: int) -> list[dict]:  # as the trainer draws them at this step
        return fresh_inputs(trainer.train_dataset, groups, G, trainer.args.seed, trainer.state.global_step, attempt)

    first = draw(2, attempt=1)
    assert [r["question"] for r in first] == [r["question"] for r in draw(2, attempt=1)]
    assert len(first) == 2 * G and first[0]["question"] == first[G - 1]["question"]
    assert [r["question"] for r in first] != [r["question"] for r in draw(2, attempt=2)]


# ---- the batch operations, on hand-made batches ------------------------------------------------------------


def hand_batch(prompt_lengths: list[int], completion_lengths: list[int], pad: int = 0) -> dict:
    width_p, width_c = max(prompt_lengths), max(completion_lengths)
    rows = len(prompt_lengths)
    prompt_mask = torch.tensor([[0] * (width_p - n) + [1] * n for n in prompt_lengths])
    completion_mask = torch.tensor([[1] * n + [0] * (width_c - n) for n in completion_lengths])
    return {
        "prompt_ids": torch.where(prompt_mask.bool(), torch.arange(rows)[:, None] + 10, pad),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.where(completion_mask.bool(), torch.arange(rows)[:, None] + 100, pad),
        "completion_mask": completion_mask,
        "advantages": torch.arange(rows, dtype=torch.float32),
        "old_per_token_logps": -completion_mask.float(),
        "num_items_in_batch": completion_mask.sum(),
    }


def test_select_rows_keeps_the_rows_and_cuts_only_right_padding():
    batch = hand_batch([2, 3, 1], [5, 2, 3])
    kept = select_rows(batch, torch.tensor([1, 2]))
    assert kept["completion_ids"].tolist() == [[101, 101, 0], [102, 102, 102]]
    assert kept["prompt_ids"].tolist() == [[11, 11, 11], [0, 0, 12]]
    assert kept["advantages"].tolist() == [1.0, 2.0] and kept["old_per_token_logps"].shape == (2, 3)
    assert kept["num_items_in_batch"] == 10  # the whole batch's tokens: the dapo normaliser does not change


def test_concatenate_repads_prompts_left_and_completions_right_and_recounts_tokens():
    merged = concatenate([hand_batch([1], [2], pad=7), hand_batch([3, 2], [1, 4], pad=7)], pad_token_id=7)
    assert merged["prompt_ids"].tolist() == [[7, 7, 10], [10, 10, 10], [7, 11, 11]]
    assert merged["completion_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert merged["completion_ids"][0].tolist() == [100, 100, 7, 7]
    assert merged["old_per_token_logps"][0].tolist() == [-1.0, -1.0, 0.0, 0.0]
    assert merged["advantages"].tolist() == [0.0, 0.0, 1.0] and merged["num_items_in_batch"] == 7


@pytest.mark.parametrize(
    ("loss_type", "expected"), [("grpo", 2 / 3), ("dr_grpo", 2 / 3), ("bnpo", 5 / 10), ("dapo", 1.0), ("cispo", 1.0)]
)
def test_loss_scale_restores_each_loss_types_normaliser(loss_type, expected):
    batch = hand_batch([1, 1, 1], [5, 2, 3])
    assert loss_scale(loss_type, batch, torch.tensor([False, True, True])) == pytest.approx(expected)


def test_zero_spread_groups_counts_float_noise_and_unscorable_groups_as_no_spread():
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.0, 1.0, 0.0], [float("nan")] * 3, [0.3, 0.3 + 1e-9, float("nan")]])
    assert zero_spread_groups(rewards).tolist() == [True, False, True, True]


@pytest.mark.e2e
def test_the_command_line_resamples_and_logs_it(tmp_path):
    result = run_cli(
        *TINY_RUN,
        "logger=none",
        f"hydra.run.dir={tmp_path}",
        "trainer.zero_variance_groups=resample",
        "trainer.max_resample_batches=1",
        "eval.before=false",
        "eval.after=false",
    )
    assert result.returncode == 0, result.stderr
    steps = logged_steps(tmp_path)
    logged = [s for s in steps if "resample/batches" in s]
    assert len(logged) == 2 and all(1 <= s["resample/batches"] <= 2 for s in logged)
    assert all("zero_variance/groups_left_out" in s for s in logged)
