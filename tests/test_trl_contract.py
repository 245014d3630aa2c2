"""The contract with TRL: everything grpo_exp's one seam (grpo_exp.trainer.seam) relies on.

When a TRL upgrade changes any of it (a private attribute, the layout of its last-batch logs, how it aggregates
rewards into advantages), these tests fail and say what changed, instead of the group statistics going quietly
wrong. TRL's GRPOTrainer really generates and scores here (tiny model), nothing is mocked.
"""

import importlib.metadata
import inspect
import math

import pytest
import torch
from packaging.specifiers import SpecifierSet
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from grpo_exp.data import load_splits
from grpo_exp.models import build_tiny_model, load_tokenizer
from grpo_exp.trainer.config import grpo_config
from grpo_exp.trainer.seam import ScoredBatch, aggregated_reward
from tests.conftest import TINY_RUN, compose_config
from tests.tiny_trainer import Recording


def test_trl_is_pinned_to_one_minor_version_and_installed_at_it():
    (requirement,) = [r for r in importlib.metadata.requires("grpo-exp") if r.split(";")[0].startswith("trl")]
    specifier = SpecifierSet(requirement.removeprefix("trl").split(";")[0].strip())
    installed = importlib.metadata.version("trl")
    assert installed in specifier, f"TRL {installed} is not the version the seam was checked against ({specifier})"
    # One minor version: the next minor release is outside the pin.
    major, minor = (int(x) for x in installed.split(".")[:2])
    assert f"{major}.{minor + 1}.0" not in specifier, f"trl should be pinned to {major}.{minor}.*, not {specifier}"


def test_grpo_trainer_still_has_what_the_seam_reads():
    for name in ("_generate_and_score_completions", "_save_checkpoint", "_calculate_rewards"):
        assert callable(getattr(GRPOTrainer, name, None)), f"GRPOTrainer.{name} is gone: update grpo_exp.trainer.seam"
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters
    fields = {f.name: f for f in GRPOConfig.__dataclass_fields__.values()}
    assert fields["multi_objective_aggregation"].default == "sum_then_normalize"
    assert fields["scale_rewards"].default == "group"


def length_reward(completions, **kwargs):
    return [len(c[-1]["content"]) / 100 for c in completions]


def first_of_each_group_skipped(completions, **kwargs):
    """A component that cannot score one member of every group (as a judge whose request failed)."""
    return [None if i % 4 == 0 else float(len(c[-1]["content"]) % 3) for i, c in enumerate(completions)]


def one_step(tmp_path, aggregation: str, scale_rewards: str = "group") -> tuple[Recording, ScoredBatch]:
    cfg = compose_config(
        [
            *TINY_RUN,
            "trainer.num_generations=4",
            "trainer.max_steps=1",
            "logger=none",
            f"trainer.scale_rewards={scale_rewards}",
            f"+trainer.extra.multi_objective_aggregation={aggregation}",
        ]
    )
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model_dir = tmp_path / "model"
    build_tiny_model(cfg.model, tokenizer, cfg.trainer.seed).save_pretrained(model_dir)
    train_set, _ = load_splits(cfg.dataset)
    trainer = Recording(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[length_reward, first_of_each_group_skipped],
        args=grpo_config(cfg.trainer, tmp_path / "trainer", "none", [1.0, 0.5], False),
        train_dataset=train_set,
        processing_class=tokenizer,
    )
    trainer.train()
    (batch,) = trainer.batches
    return trainer, batch


@pytest.mark.parametrize(
    ("aggregation", "scale_rewards"),
    [("sum_then_normalize", "group"), ("sum_then_normalize", "none"), ("normalize_then_sum", "group")],
)
def test_the_scored_batch_is_what_trl_scored_and_its_reward_is_trls_aggregate(tmp_path, aggregation, scale_rewards):
    trainer, batch = one_step(tmp_path, aggregation, scale_rewards)
    n = 2 * 4
    assert batch.group_size == 4 and batch.reward_names == ["length_reward", "first_of_each_group_skipped"]
    assert len(batch.prompts) == len(batch.texts) == len(batch.rows) == n and batch.trajectories is None
    # The per-component rewards are the functions' own outputs for these completions (None -> NaN).
    messages = [[{"role": "assistant", "content": t}] for t in batch.texts]
    assert batch.rewards[:, 0].tolist() == pytest.approx(length_reward(messages))
    skipped = first_of_each_group_skipped(messages)
    if aggregation == "sum_then_normalize":  # the seam gave each skipped member its group's mean for the component
        assert batch.imputed[:, 1].tolist() == [v is None for v in skipped] and not batch.rewards.isnan().any()
    else:  # TRL already gives a skipped member a z-score of 0 for the component
        assert [math.isnan(v) for v in batch.rewards[:, 1].tolist()] == [v is None for v in skipped]
        assert not batch.imputed.any()
    assert all(r["solution"] is not None and r["question"] for r in batch.rows)
    assert batch.lengths.shape == (n,) and (batch.lengths >= 1).all()

    # TRL's logged mean reward is the weighted nansum of the components, whatever the aggregation.
    logged = trainer.state.log_history[0]
    weighted = aggregated_reward(batch.rewards, torch.tensor([1.0, 0.5]), "sum_then_normalize", 4)
    assert logged["reward"] == pytest.approx(torch.nanmean(weighted).item(), abs=1e-5)

    # The advantages TRL trained with follow from the seam's aggregated reward by TRL's documented formula.
    total = batch.grouped(batch.total)
    if aggregation == "sum_then_normalize":
        expected = total - total.mean(dim=1, keepdim=True)
        if scale_rewards == "group":
            expected = expected / (total.std(dim=1, keepdim=True) + 1e-4)
    else:  # normalised per component inside the group, then summed, then normalised over the batch
        expected = (total - total.mean()) / (total.std() + 1e-4)
    assert batch.grouped(batch.advantages).flatten().tolist() == pytest.approx(expected.flatten().tolist(), abs=1e-4)
