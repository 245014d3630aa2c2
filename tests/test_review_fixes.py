"""Edge cases found in review: each a value that failed loudly with a traceback, or quietly did the wrong thing."""

import math

import pytest
import yaml

from grpo_exp.data import check_data_files
from grpo_exp.errors import UserError
from grpo_exp.evaluate import resolve_source
from grpo_exp.rewards.custom import checked_rewards
from grpo_exp.run.validation import stop_reason, validations_without_improvement
from grpo_exp.verification.labels import user_verifier
from support.config import compose_config


def test_validations_that_measured_nothing_neither_spend_the_patience_nor_crash():
    nan = math.nan
    assert stop_reason([nan, nan, nan], [nan, nan, nan], patience=2, stop_at=None) is None
    assert validations_without_improvement([0.6, nan, nan], [0.05, nan, nan]) == 0
    assert "(best 0.600)" in stop_reason([0.6, nan, 0.55, 0.58], [0.05, nan, 0.05, 0.05], patience=2, stop_at=None)


def test_a_runner_up_checkpoint_is_evaluated_with_its_runs_config(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["dataset=chain_sum", "hydra.job.name=x"]))
    runner_up = tmp_path / "checkpoint-top" / "step-20"
    runner_up.mkdir(parents=True)
    source = resolve_source([str(runner_up)])
    assert "dataset=chain_sum" in source.overrides
    assert f"model.name_or_path={runner_up.resolve()}" in source.overrides


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_a_users_reward_that_is_not_finite_stops_the_run_naming_the_component(bad):
    with pytest.raises(
        UserError, match=r"reward component 'mine' .* returned -?inf for completion 1: rewards are finite"
    ):
        checked_rewards("mine", "my_rewards:f", [0.5, bad], 2)


def test_a_dataset_function_without_dataset_function_is_refused():
    cfg = compose_config(["dataset.function=my_data:rows"])
    with pytest.raises(UserError, match=r"dataset.function is read only with dataset=function .* add dataset=function"):
        check_data_files(cfg.dataset)


def test_what_the_users_labels_raise_is_one_message_naming_the_key():
    def is_correct(completion, solution):
        return {"a": True}[completion]

    verify = user_verifier(is_correct, "my_checks:is_correct", batched=False)
    assert verify(["a"], ["x"]) == [True]
    with pytest.raises(
        UserError, match=r"verifier.labels=my_checks:is_correct raised KeyError: 'b' \(on completion 1\)"
    ):
        verify(["a", "b"], ["x", "y"])
