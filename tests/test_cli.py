"""The command line as users meet it: Hydra's flags, and one clear message (no stack trace) for user errors.

Every config mistake is checked in-process (composition, then `resolve`, the first thing a training job does);
one mistake of each kind also goes through the real command line, to prove what the user sees."""

import importlib

import pytest
import yaml
from hydra.errors import CompactHydraException
from omegaconf.errors import OmegaConfBaseException

from grpo_exp.run.resolve import resolve
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli


def test_cfg_job_composes_a_reward_mix():
    result = run_cli("--cfg", "job", "reward=math+format")
    assert result.returncode == 0, result.stderr
    components = yaml.safe_load(result.stdout)["reward"]["components"]
    assert list(components) == ["math", "format"]


def test_help_lists_groups_and_options():
    result = run_cli("--help")
    assert result.returncode == 0
    for line in [
        "model: pretrained, shape, smollm2_135m, tiny",
        "reward: confidence, correct, environment, format, judge, length, length_by_correctness, math, overlong,",
        "'+'-joined mix",
    ]:
        assert line in result.stdout


USER_ERRORS = [
    (["model=nope"], "Could not find 'model/nope'"),
    (["trainer.beta=abc"], "full_key: trainer.beta"),
    (["reward=math+nope"], "known components: confidence, correct, environment, format, judge, length"),
    (["reward=math+judge", "judge=openai"], "judge.model is required with judge=openai"),
    (["reward=math+judge", "judge.model=nobody/no-such-judge"], "model.name_or_path='nobody/no-such-judge'"),
    (["trainer.num_generations=1"], "trainer.num_generations=1: GRPO needs a group of at least 2"),
    (["dataset=files", "dataset.path=/nope/train.jsonl"], "dataset.path='/nope/train.jsonl' does not exist"),
    (["model=pretrained", "model.name_or_path=Qwen/Qwen2.5-1.5B-Instruct"], "model.name_or_path='Qwen/Qwen"),
    (["dataset=files"], "dataset.path is required with dataset=files"),
    (
        ["reward=math+selfverify", "reward.components.selfverify.balance=share", "trainer.prompts_per_step=1"],
        "schedule=joint mixes verification groups",
    ),
    (["reward=math+selfverify", "trainer.prompts_per_step=2"], "leaves no generation group"),
    (
        ["reward=math+selfverify", "reward.components.selfverify.schedule=interleave", "trainer.prompts_per_step=1"],
        "balance=pairs puts a pair's two answers in two groups",
    ),
    (
        [
            "reward=math+selfverify",
            "trainer.prompts_per_step=3",
            "reward.components.selfverify.scale_by_pass_rate=true",
        ],
        "trainer.scale_rewards=group divides out",
    ),
    (["model=pretrained"], "model.name_or_path is required with model=pretrained"),
    (["+trainer.extra.per_device_train_batch_size=3"], "derived from trainer.prompts_per_step"),
    (["+trainer.extra.num_generatoins=3"], "did you mean ['num_generations'"),
    (["trainer.zero_variance_groups=drop"], "Invalid value 'drop', expected one of [keep, skip, resample]"),
    (["trainer.max_resample_batches=0"], "trainer.max_resample_batches=0"),
    (
        ["reward=math+selfverify", "trainer.prompts_per_step=3", "trainer.zero_variance_groups=resample"],
        "use zero_variance_groups=skip or keep with reward=...selfverify",
    ),
]


def printed_error(overrides: list[str]) -> str:
    """What the command line prints for a config mistake, raised in-process: Hydra prints a
    CompactHydraException as its message alone (and an OmegaConf cause under it), with no stack trace."""
    with pytest.raises(CompactHydraException) as caught:
        resolve(compose_config([*TINY_RUN, "logger=none", *overrides]))
    error = caught.value
    cause = f"\n{error.__cause__}" if isinstance(error.__cause__, OmegaConfBaseException) else ""
    return f"{error}{cause}"


@pytest.mark.parametrize("overrides,expected", USER_ERRORS)
def test_user_errors_are_one_message_before_any_model_loads(overrides, expected, no_model_loads):
    assert expected in printed_error(overrides)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["trainer.beta=abc"], "full_key: trainer.beta"),  # refused by Hydra's composition, before the job
        (["trainer.num_generations=1"], "GRPO needs a group of at least 2"),  # refused by the job's first check
    ],
)
def test_the_command_line_prints_a_user_error_without_a_traceback_or_a_model(overrides, expected, tmp_path):
    result = run_cli(*TINY_RUN, "logger=none", f"hydra.run.dir={tmp_path}", *overrides)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "Loading model" not in result.stderr + result.stdout
    assert not (tmp_path / "checkpoint-final").exists()


@pytest.mark.parametrize("module", ["grpo_exp.evaluate", "grpo_exp.compare"])
def test_every_entry_point_prints_its_usage_with_help(module, capsys):
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(module).main(["--help"])
    assert exited.value.code == 0
    assert f"usage: python -m {module}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        (lambda: 3, 3),
        (lambda: {"accuracy": 1.0}, 0),
        (lambda: None, 0),
        ("user", "Error: bad value"),
        ("hydra", "Error: bad override"),
    ],
)
def test_every_command_exits_through_one_wrapper(outcome, code):
    """errors.run_command, every command's __main__: main's int is the exit code; a user or Hydra error, its message."""
    from hydra.errors import HydraException

    from grpo_exp.errors import UserError, run_command

    def main():
        if outcome == "user":
            raise UserError("bad value")
        if outcome == "hydra":
            raise HydraException("bad override")
        return outcome()

    with pytest.raises(SystemExit) as exited:
        run_command(main)
    assert exited.value.code == code
