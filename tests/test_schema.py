"""One schema: every default written once, every value a user can type checked against its meaning before any
model loads (in-process: composing the config and building the run's cheap parts is all that runs)."""

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from grpo_exp import schema
from grpo_exp.errors import UserError
from grpo_exp.paths import CONF_DIR
from grpo_exp.rewards.registry import REWARD_COMPONENTS
from grpo_exp.run.build import build_parts
from grpo_exp.run.resolve import resolve
from support.config import TINY_RUN, compose_config

OPTION_GROUPS = {
    "model": schema.ModelSchema,
    "dataset": schema.DatasetSchema,
    "judge": schema.JudgeSchema,
    "scorer": schema.ScorerSchema,
    "trainer": schema.TrainerSchema,
    "rollout": schema.RolloutSchema,
    "logger": schema.LoggerSchema,
}


# What an option is (its name, source or backend) is stated in its file even where it equals the default.
IDENTITY = {"defaults", "name", "source", "backend"}


def _repeated_defaults(values: dict, defaults: dict, prefix: str = "") -> list[str]:
    repeated = []
    for key, value in values.items():
        if key in IDENTITY or key not in defaults:
            continue
        if isinstance(value, dict) and isinstance(defaults[key], dict):
            repeated += _repeated_defaults(value, defaults[key], f"{prefix}{key}.")
        elif value == defaults[key]:
            repeated.append(f"{prefix}{key}")
    return repeated


@pytest.mark.parametrize("group", sorted(OPTION_GROUPS))
def test_option_files_hold_no_default_twice(group):
    defaults = OmegaConf.to_container(OmegaConf.structured(OPTION_GROUPS[group]), enum_to_str=True)
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        values = OmegaConf.to_container(OmegaConf.load(path))
        assert not _repeated_defaults(values, defaults), f"{path.name} repeats the schema's defaults"


def test_reward_files_set_only_the_weight_and_config_yaml_no_schema_default():
    for path in sorted((CONF_DIR / "reward").glob("*.yaml")):
        values = OmegaConf.to_container(OmegaConf.load(path))
        assert list(values["components"][path.stem]) == ["weight"], path.name
    top = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    assert set(top) == {"defaults", "hydra"}


def test_the_composed_config_shows_every_setting_of_a_component_with_its_default():
    cfg = compose_config(["reward=math+selfverify"])
    settings = cfg.reward.components.selfverify
    assert set(settings) == {f.name for f in dataclasses.fields(REWARD_COMPONENTS["selfverify"])}
    assert (
        settings.weight == 1.0 and settings.schedule is schema.SelfVerifySchedule.joint and settings.buffer_size == 64
    )
    assert cfg.trainer.num_generations == 4 and cfg.eval.batch_size == 16 and cfg.stats.table_every == 10


@pytest.mark.parametrize(
    "override,key",
    [
        ("reward.components.selfverify.every=often", "reward.components.selfverify.every"),
        ("reward.components.selfverify.strict_verdict=maybe", "reward.components.selfverify.strict_verdict"),
        ("reward.components.math.weight=heavy", "reward.components.math.weight"),
    ],
)
def test_component_settings_are_typed_at_composition(override, key):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["reward=math+selfverify", override])
    assert err.value.__cause__.full_key == key


def test_an_unknown_component_setting_is_refused_at_composition():
    with pytest.raises(ConfigCompositionException, match="reward.components.format.colour"):
        compose_config(["reward=math+format", "reward.components.format.colour=red"])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.learning_rate=-1e-5"], "trainer.learning_rate=-1e-05 must be greater than 0.0"),
        (["trainer.beta=-0.1"], "trainer.beta=-0.1 must be at least 0.0"),
        (["trainer.beta=nan"], "trainer.beta=nan: must be a finite number"),
        (["trainer.top_p=1.5"], "trainer.top_p=1.5 must be at most 1.0"),
        (["trainer.temperature=0"], "trainer.temperature=0.0: must be positive (GRPO samples)"),
        (["trainer.save_steps=-1"], "trainer.save_steps=-1: must be 0 (off) or a number of steps"),
        (["trainer.seed=-3"], "trainer.seed=-3 must be at least 0"),
        (["dataset.eval_size=0"], "dataset.eval_size=0 must be at least 1"),
        (["dataset.prompt.template=Solve it"], "dataset.prompt.template must contain {question}"),
        (["model.lora.dropout=1.0"], "model.lora.dropout=1.0 must be less than 1.0"),
        (["eval.samples=-1"], "eval.samples=-1 must be at least 0"),
        (["stats.table_every=0"], "stats.table_every=0 must be at least 1"),
        (
            ["reward=math+length", "reward.components.length.target_chars=0"],
            "reward.components.length.target_chars=0 must be at least 1",
        ),
        (
            ["reward=math+repetition", "reward.components.repetition.max_penalty=0.5"],
            "reward.components.repetition.max_penalty=0.5 must be at most 0.0",
        ),
        (
            ["reward=math+selfverify", "reward.components.selfverify.fraction=0"],
            "reward.components.selfverify.fraction=0.0 must be greater than 0.0",
        ),
        (
            ["reward=math+selfverify", "reward.components.selfverify.yes_share=1.5"],
            "reward.components.selfverify.yes_share=1.5 must be at most 1.0",
        ),
        (
            ["reward=math+selfverify", "reward.components.selfverify.template=Is it right?"],
            "reward.components.selfverify.template must contain {question} and {answer}",
        ),
        (["reward=math+judge", "judge.timeout=0"], "judge.timeout=0.0 must be greater than 0.0"),
        (["reward=math+judge", "judge.retries=-1"], "judge.retries=-1 must be at least 0"),
        (["reward=math+judge", "judge.rubric.template=Rate it"], "judge.rubric.template must contain {prompt}"),
        (["scorer=genrm", "scorer.template='Is {question} right?'"], "scorer.template must contain {answer}"),
        (["rollout=multiturn", "rollout.python.timeout_s=0"], "rollout.python.timeout_s=0.0 must be greater than 0.0"),
        (
            ["+trainer.extra.multi_objective_aggregation=sum"],
            "trainer.extra.multi_objective_aggregation='sum' is not one of "
            "['sum_then_normalize', 'normalize_then_sum']",
        ),
        (["+trainer.extra.top_k=lots"], "trainer.extra.top_k='lots': GRPOConfig expects int"),
        (["+trainer.extra.mask_truncated_completions=3"], "trainer.extra.mask_truncated_completions=3: GRPOConfig"),
        (["+trainer.extra.optim=sgdx"], "trainer: "),
    ],
)
def test_bad_values_fail_with_one_message_naming_the_key(overrides, message):
    cfg = compose_config([*TINY_RUN, "logger=none", *overrides])
    with pytest.raises(UserError) as err:
        resolve(cfg, trainer_dir=Path("unused"))  # with GRPOConfig's own checks
    assert message in str(err.value)


@pytest.mark.parametrize(
    "override,key,allowed",
    [
        ("reward.components.format.style=xml", "reward.components.format.style", "[boxed, think_answer, hash]"),
        (
            "reward.components.selfverify.schedule=weekly",
            "reward.components.selfverify.schedule",
            "[joint, interleave, verify_only]",
        ),
    ],
)
def test_a_choice_outside_its_enum_fails_at_composition_naming_the_key_and_the_choices(override, key, allowed):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config([*TINY_RUN, "reward=math+format+selfverify", override])
    assert err.value.__cause__.full_key == key and allowed in str(err.value.__cause__)


def test_a_valid_config_builds():
    spec = resolve(
        compose_config([*TINY_RUN, "reward=math+format+selfverify", "trainer.prompts_per_step=3", "logger=none"])
    )
    parts = build_parts(spec, ["4", "7"])
    assert parts.reward_weights == [1.0, 0.2, 1.0] and "selfverify" in parts.tasks and parts.p_yes is not None


@pytest.mark.parametrize(
    "name,text,overrides,message",
    [
        ("t.jsonl", '{"question": "1+1?", "answer": "2"\n', [], "could not be read as jsonl"),
        ("t.jsonl", "\n\n", [], "holds no records"),
        (
            "t.jsonl",
            '{"problem": "1+1?", "answer": "2"}\n',
            [],
            "dataset.question_field='question' is not a column of dataset.path=",
        ),
        ("t.jsonl", '{"question": "1+1?", "sol": "2"}\n', [], "dataset.answer_field='answer' is not a column"),
        ("t.jsonl", '{"question": "1+1?", "answer": "2"}\n', ["dataset.answer_format=gsm8k"], "no '#### <answer>'"),
        ("t.csv", "question,answer\n1+1?,2\n", [], "unsupported file type"),
    ],
)
def test_data_files_are_read_and_checked_before_training(tmp_path, name, text, overrides, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError) as err:
        resolve(compose_config([*TINY_RUN, "logger=none", "dataset=files", f"dataset.path={path}", *overrides]))
    assert message in str(err.value)


def test_a_parquet_file_is_checked_by_its_columns(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"problem": ["1+1?"], "answer": ["2"]}), path)
    with pytest.raises(UserError, match="dataset.question_field='question' is not a column.*'problem'"):
        resolve(compose_config([*TINY_RUN, "logger=none", "dataset=files", f"dataset.path={path}"]))
    ok = compose_config(
        [*TINY_RUN, "logger=none", "dataset=files", f"dataset.path={path}", "dataset.question_field=problem"]
    )
    resolve(ok)


def test_a_good_eval_file_does_not_excuse_a_bad_training_file(tmp_path):
    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text(json.dumps({"q": "1+1?", "answer": "2"}) + "\n")
    held_out.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    cfg = compose_config(
        [*TINY_RUN, "logger=none", "dataset=files", f"dataset.path={train}", f"dataset.eval_path={held_out}"]
    )
    with pytest.raises(UserError, match="dataset.question_field='question' is not a column of dataset.path="):
        resolve(cfg)


def test_an_unknown_reasoning_gym_task_fails_before_training():
    with pytest.raises(UserError, match="dataset.task='basic_arithmetc'.*basic_arithmetic"):
        resolve(compose_config([*TINY_RUN, "logger=none", "dataset.task=basic_arithmetc"]))


def test_a_task_config_the_task_does_not_take_fails_before_training():
    # the default task's settings, left in task_config when the task changed, are named: the user sees what to drop
    with pytest.raises(UserError, match=r"dataset.task_config for 'leg_counting' \(min_terms=2, .*\) is invalid"):
        resolve(compose_config([*TINY_RUN, "logger=none", "dataset.task=leg_counting"]))
