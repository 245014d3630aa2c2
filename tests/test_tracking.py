"""Run identity, secret redaction, the local metrics file and the end-of-run summary's pure parts."""

import math

from grpo_exp.run.report import reward_trend
from grpo_exp.run.tracking import REDACTED, MetricsFileCallback, read_metrics, redact, run_name


def test_redact_masks_secrets_but_keeps_env_var_names():
    config = {
        "judge": {"api_key": "sk-123", "api_key_env": "OPENAI_API_KEY", "nested": [{"token": "t"}]},
        "x": 1,
        "logger": {"tracking_uri": "https://me:pw@mlflow.example/x", "other": "http://host:5000/a@b"},
        "extra": {"hub_token": "hf_x", "access_token": "a"},
    }
    assert redact(config) == {
        "judge": {"api_key": REDACTED, "api_key_env": "OPENAI_API_KEY", "nested": [{"token": REDACTED}]},
        "x": 1,
        "logger": {"tracking_uri": f"https://{REDACTED}@mlflow.example/x", "other": "http://host:5000/a@b"},
        "extra": {"hub_token": REDACTED, "access_token": REDACTED},
    }


def test_redact_keeps_settings_that_only_mention_tokens():
    """Counts of tokens, the verdict tokens and a tokenizer are what a run's record needs, not secrets."""
    config = {"judge": {"max_new_tokens": 96, "tokenizer": "Qwen/Qwen2.5-32B"}, "scorer": {"yes_token": "Yes"}}
    config |= {"rollout": {"max_tokens_per_turn": 64}, "no_token": "No"}
    assert redact(config) == config


def test_run_name_comes_from_the_overrides():
    assert run_name(["trainer.num_generations=8", "trainer.beta=0.04", "hydra.run.dir=x"]) == (
        "trainer.num_generations=8,trainer.beta=0.04"
    )
    assert run_name(["+experiment=foo"]) == "experiment=foo"
    assert run_name([]) == "defaults"


def test_a_run_name_never_carries_a_secret():
    """The name goes to every tracker: a secret-looking key keeps its name, not its value."""
    assert run_name(["+trainer.extra.hub_token=hf_abc", "judge.api_key_env=MY_KEY", "trainer.beta=0.04"]) == (
        f"trainer.extra.hub_token={REDACTED},judge.api_key_env=MY_KEY,trainer.beta=0.04"
    )
    assert run_name(["judge.base_url=http://me:pw@judge:8000/v1"]) == f"judge.base_url=http://{REDACTED}@judge:8000/v1"


class State:
    is_world_process_zero = True
    global_step = 3


def test_metrics_file_appends_scalar_logs(tmp_path):
    callback = MetricsFileCallback(tmp_path / "metrics.jsonl")
    callback.on_log(None, State(), None, logs={"reward": 0.5, "table": object()})
    callback.on_log(None, State(), None, logs={"reward": 0.7})
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 3, "reward": 0.5},
        {"step": 3, "reward": 0.7},
    ]


def test_reward_trend_compares_first_and_last_quarter():
    metrics = [{"reward": r} for r in [0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0]] + [{"loss": 1.0}]
    assert reward_trend(metrics) == (0.0, 1.0)
    assert all(math.isnan(v) for v in reward_trend([]))


def test_swept_keys_come_from_sweep_syntax_and_sweeper_params():
    from grpo_exp.run.tracking import swept_keys

    overrides = ["model=tiny", "trainer.beta=0.0,0.04", "reward=math,math+format", "trainer.seed=range(1,3)"]
    assert swept_keys(overrides, {"trainer.learning_rate": "interval(1e-6, 1e-4)"}) == {
        "trainer.beta",
        "reward",
        "trainer.seed",
        "trainer.learning_rate",
    }
    assert run_name(["model=tiny", "trainer.beta=0.04"], {"trainer.beta"}) == "trainer.beta=0.04"


def test_an_offline_wandb_run_is_created_and_finished_even_on_failure(tmp_path, monkeypatch):
    import wandb

    from grpo_exp.run.tracking import Tracker
    from grpo_exp.schema import LoggerBackend, WandbMode

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc credentials either: auto means offline
    logger = type(
        "Logger",
        (),
        {"backend": LoggerBackend.wandb, "mode": WandbMode.auto, "project": "p", "entity": None, "tags": ["t"]},
    )()
    config = {"judge": {"api_key": "sk-do-not-log"}, "trainer": {"beta": 0.04}}
    tracker = Tracker(logger, tmp_path, "trainer.beta=0.04", "sweep-1", ["model:tiny"], config)
    assert tracker.mode == "offline" and wandb.run is not None
    assert wandb.run.config["judge"]["api_key"] == REDACTED and wandb.run.config["trainer"]["beta"] == 0.04
    assert tracker.identity() == {
        "wandb_id": wandb.run.id,
        "wandb_name": "trainer.beta=0.04",
        "wandb_group": "sweep-1",
        "wandb_job_type": "train",
    }
    assert tracker.sync_command().startswith("wandb sync ")
    tracker.finish(failed=True)
    assert wandb.run is None
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
