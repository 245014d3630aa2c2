"""The P(Yes) scorer's old names (the `verifier` group: verifier=genrm | self | math_verify, verifier.model...) still
work where the user types them, translated to the `scorer` group with one warning line naming old and new; the new
names work; `verifier.labels` is the correctness labels, as it was (grpo_exp.deprecated)."""

import sys
from pathlib import Path

import pytest
import yaml

from grpo_exp.deprecated import renamed_config, translate_argv, translate_override
from grpo_exp.run.resolve import resolve
from grpo_exp.run.setting_paths import saved_path_overrides
from grpo_exp.run.sources import compose_with, resolve_source
from grpo_exp.run_files import FINAL_CHECKPOINT_DIR
from grpo_exp.schema import ScorerName
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli, run_command

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")


@pytest.mark.parametrize(
    "old,new",
    [
        ("verifier=genrm", "scorer=genrm"),
        ("verifier=self", "scorer=self"),
        ("verifier=math_verify", "scorer=none"),
        ("verifier=genrm,math_verify", "scorer=genrm,none"),  # a sweep
        ("hydra.sweeper.params.verifier=choice(self,math_verify)", "hydra.sweeper.params.scorer=choice(self,none)"),
        ("verifier.name=math_verify", "scorer.name=none"),
        ("verifier.model=tiny", "scorer.model=tiny"),
        ("+verifier.template=Is {answer} right for {question}?", "+scorer.template=Is {answer} right for {question}?"),
        ("verifier.yes_token=Y", "scorer.yes_token=Y"),
        ("verifier.no_token=N", "scorer.no_token=N"),
        ("verifier.batch_size=4", "scorer.batch_size=4"),
        ("verifier.base_url=http://h:8000/v1", "scorer.base_url=http://h:8000/v1"),
        ("verifier.api_key_env=KEY", "scorer.api_key_env=KEY"),
    ],
)
def test_an_old_name_is_translated_with_a_message_naming_both(old, new):
    assert translate_override(old) == (new, f"{old} is deprecated: use {new}")


@pytest.mark.parametrize(
    "override", ["verifier.labels=exact_match", "verifier.labels_batched=true", "scorer=genrm", "scorer.model=tiny"]
)
def test_the_labels_and_the_new_names_are_left_as_they_are(override):
    assert translate_override(override) == (override, None)


def test_flags_and_their_values_are_not_overrides():
    argv = ["-m", "--config-dir", "verifier=genrm", "--cfg", "job", "verifier=self"]
    assert translate_argv(argv) == ["-m", "--config-dir", "verifier=genrm", "--cfg", "job", "scorer=self"]


def test_the_new_names_compose_and_resolve():
    cfg = compose_config([*TINY_RUN, "reward=math+confidence", "scorer=genrm", "scorer.model=tiny", "logger=none"])
    assert cfg.scorer.name is ScorerName.genrm and cfg.scorer.model == "tiny"
    assert set(cfg.verifier) == {"labels", "labels_batched", "answer"}
    resolve(cfg, processes=1)
    assert compose_config().scorer.name is ScorerName.none  # the default: no P(Yes) scorer


def test_the_command_line_translates_old_names_with_one_warning_each():
    result = run_cli("--cfg", "job", "verifier=genrm", "verifier.model=tiny", "verifier.labels=exact_match")
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert cfg["scorer"]["name"] == "genrm" and cfg["scorer"]["model"] == "tiny"
    assert cfg["verifier"] == {"labels": "exact_match", "labels_batched": False, "answer": "auto"}
    warnings = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert warnings == [
        "warning: verifier=genrm is deprecated: use scorer=genrm",
        "warning: verifier.model=tiny is deprecated: use scorer.model=tiny",
    ]


def test_grpo_exp_train_translates_old_names_too(tmp_path):
    result = run_command([GRPO_EXP, "train", "--cfg", "job", "verifier=math_verify"], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["scorer"]["name"] == "none"
    assert "verifier=math_verify is deprecated: use scorer=none" in result.stderr


@pytest.mark.e2e
def test_a_sweep_over_old_names_runs_the_new_ones(tmp_path):
    """Each job is refused at resolve (reward=math reads no P(Yes)), the first thing a job does: enough to see which
    options it was given."""
    result = run_cli("-m", "verifier=genrm,self", *TINY_RUN, "logger=none", f"hydra.sweep.dir={tmp_path}")
    assert "warning: verifier=genrm,self is deprecated: use scorer=genrm,self" in result.stderr
    assert result.stderr.count("deprecated") == 1
    for job, option in enumerate(["genrm", "self"]):
        overrides = yaml.safe_load((tmp_path / str(job) / ".hydra" / "overrides.yaml").read_text())
        assert overrides[0] == f"scorer={option}", overrides
    assert "scorer.name=genrm is read only by what reads a P(Yes)" in result.stdout + result.stderr


def _old_run_dir(tmp_path: Path) -> Path:
    """A run directory written before the rename: its overrides and config.yaml say verifier=genrm, verifier.model."""
    run_dir = tmp_path / "run"
    (run_dir / FINAL_CHECKPOINT_DIR).mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    frozen = tmp_path / "frozen"
    (frozen / FINAL_CHECKPOINT_DIR).mkdir(parents=True)  # a grpo_exp run directory as the frozen verifier
    overrides = [*TINY_RUN, "reward=math+confidence", "verifier=genrm", "verifier.model=frozen", "logger=none"]
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    saved = {"verifier": {"name": "genrm", "labels": "math_verify", "labels_batched": False, "model": str(frozen)}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    return run_dir


def test_evaluating_an_old_run_directory_recomposes_it_under_the_new_names(tmp_path, capsys):
    run_dir = _old_run_dir(tmp_path)
    assert saved_path_overrides(run_dir) == [f"scorer.model='{tmp_path / 'frozen'}'"]
    source = resolve_source([str(run_dir), "verifier.batch_size=2"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert warnings == [
        "warning: verifier.batch_size=2 is deprecated: use scorer.batch_size=2",
        f"warning: verifier=genrm is deprecated: use scorer=genrm ({run_dir / '.hydra' / 'overrides.yaml'})",
        "warning: verifier.model=frozen is deprecated: use scorer.model=frozen "
        f"({run_dir / '.hydra' / 'overrides.yaml'})",
    ]
    cfg = compose_with(source.config_sources, source.overrides)
    assert cfg.scorer.name is ScorerName.genrm and cfg.scorer.batch_size == 2
    assert cfg.scorer.model == str(tmp_path / "frozen")  # the saved absolute path, as before the rename
    assert cfg.model.name_or_path == str((run_dir / FINAL_CHECKPOINT_DIR).resolve())


def test_an_old_saved_config_reads_as_the_new_one():
    old = {"model": {}, "verifier": {"name": "math_verify", "labels": "exact_match", "labels_batched": False}}
    old["verifier"] |= {"model": "initial_policy", "template": "t", "batch_size": 16}
    new = renamed_config(old)
    assert list(new) == ["model", "verifier", "scorer"]
    assert new["verifier"] == {"labels": "exact_match", "labels_batched": False}
    assert new["scorer"] == {"name": "none", "model": "initial_policy", "template": "t", "batch_size": 16}
    assert renamed_config(new) == new


def test_a_config_directory_with_options_of_the_old_group_is_refused_naming_the_new_one(tmp_path):
    from hydra.errors import ConfigCompositionException

    (tmp_path / "verifier").mkdir()
    (tmp_path / "verifier" / "mine.yaml").write_text("name: genrm\nmodel: tiny\n")
    with pytest.raises(ConfigCompositionException, match="verifier/: the P.Yes. scorer's options are the `scorer`"):
        compose_with([("command-line", f"file://{tmp_path}")], ["reward=math+format"])


# ---- settings that moved: rollout.invalid_move_credit is TextArena's own, rollout.textarena.invalid_move_credit -----


@pytest.mark.parametrize(
    "old,new",
    [
        ("rollout.invalid_move_credit=true", "rollout.textarena.invalid_move_credit=true"),
        ("+rollout.invalid_move_credit=true", "+rollout.textarena.invalid_move_credit=true"),
        ("~rollout.invalid_move_credit", "~rollout.textarena.invalid_move_credit"),
        (
            "hydra.sweeper.params.rollout.invalid_move_credit=true,false",
            "hydra.sweeper.params.rollout.textarena.invalid_move_credit=true,false",
        ),
    ],
)
def test_a_moved_setting_is_translated_with_a_message_naming_both(old, new):
    assert translate_override(old) == (new, f"{old} is deprecated: use {new}")


def test_the_moved_settings_new_key_and_its_neighbours_are_left_as_they_are():
    for override in ("rollout.textarena.invalid_move_credit=true", "rollout.invalid_move_credits=1"):
        assert translate_override(override) == (override, None)


def test_an_old_saved_config_reads_the_moved_setting_at_its_new_key():
    old = {"rollout": {"name": "multiturn", "invalid_move_credit": True}, "scorer": {"name": "none"}}
    new = renamed_config(old)
    assert new["rollout"] == {"name": "multiturn", "textarena": {"invalid_move_credit": True}}
    assert old["rollout"]["invalid_move_credit"] is True  # the saved dict itself is left as it was
    assert renamed_config(new) == new


def test_the_command_line_translates_a_moved_setting_with_one_warning():
    result = run_cli("--cfg", "job", "rollout.invalid_move_credit=true")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["rollout"]["textarena"] == {"invalid_move_credit": True, "shaped": False}
    warnings = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert warnings == [
        "warning: rollout.invalid_move_credit=true is deprecated: use rollout.textarena.invalid_move_credit=true"
    ]


def test_a_refusal_naming_a_setting_given_under_its_old_name_says_what_was_given(monkeypatch):
    import grpo_exp.deprecated as deprecated

    monkeypatch.setattr(deprecated, "GIVEN_AS", {})
    deprecated.translate_overrides(["rollout.invalid_move_credit=true", "verifier=genrm", "trainer.beta=0.1"])
    refusal = "rollout.textarena.invalid_move_credit=true is read only by the multi-turn rollout"
    assert deprecated.with_old_names(refusal) == f"{refusal} (given as rollout.invalid_move_credit=true: its old name)"
    both = "scorer=genrm needs X; leave rollout.textarena.invalid_move_credit out"
    assert deprecated.with_old_names(both).endswith(
        "(given as rollout.invalid_move_credit=true, verifier=genrm: their old names)"
    )
    for unrelated in ("scorer.model=tiny is not a model", "trainer.beta=0.1 is too large", "rollout.textarena=x"):
        assert deprecated.with_old_names(unrelated) == unrelated  # another key, or one that merely starts the same


def test_the_command_line_refusal_of_an_old_name_names_what_the_user_typed(tmp_path):
    result = run_cli("rollout.invalid_move_credit=true", *TINY_RUN, f"hydra.run.dir={tmp_path}/run")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "leave rollout.textarena.invalid_move_credit out (given as rollout.invalid_move_credit=true" in result.stderr
