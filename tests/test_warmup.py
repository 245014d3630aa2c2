"""warmup=sft: the supervised warm-up stage before GRPO (grpo_exp.run.warmup). Its settings refused before a model
loads, its demonstrations (the user's conversations, the policy's paid episodes, an expert's), TRL's SFTTrainer really
training the tiny model, then GRPO, in one run directory; resume across the stage boundary and mid-warm-up."""

import json
from pathlib import Path

import pytest
import torch

from grpo_exp.environments.textarena import TextArenaGame, guess_the_number_expert
from grpo_exp.errors import UserError
from grpo_exp.run.resume import find_attempt, load_attempt
from grpo_exp.run.warmup.sources import Episode, user_conversations
from grpo_exp.run.warmup.weights import load_weights
from support.config import TINY_RUN, resolved_config
from tests.helpers.cli import interrupted_when, run_cli

GUESS = ["+experiment=textarena_guess", "model=tiny", "trainer=debug", "dataset.eval_size=4", "logger=none"]
EXPERT = "grpo_exp.environments.textarena:guess_the_number_expert"


# ---- the settings, refused before a model loads ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["warmup=sft", "warmup.source=dataset"], "warmup.source=dataset needs warmup.data"),
        (["warmup=sft", "warmup.source=dataset", "warmup.data=nowhere.jsonl"], "warmup.data=nowhere.jsonl: no such"),
        (["warmup=sft", "warmup.source=expert"], "warmup.source=expert needs warmup.expert=module:name"),
        (["warmup=sft", "warmup.source=expert", "warmup.expert=no_such_module:play"], "warmup.expert=no_such_module"),
        (["warmup=sft", "warmup.source=expert", "warmup.expert=os:sep"], "warmup.expert=os:sep: not callable"),
        (["warmup=sft", "warmup.source=expert", "warmup.expert=os:getcwd"], r"warmup.expert=os:getcwd: takes \(\)"),
        (["warmup.steps=5"], "warmup.steps=5 is read only by the warm-up stage.*add warmup=sft"),
        (["warmup=sft", "warmup.data=x.jsonl"], "warmup.data=x.jsonl is read only with warmup.source=dataset"),
        (["warmup=sft", "warmup.source=expert", f"warmup.expert={EXPERT}", "warmup.samples_per_prompt=2"],
         "warmup.samples_per_prompt=2 is read only with warmup.source=policy"),
        (["warmup=sft", "warmup.source=dataset", "warmup.data=x.jsonl", "warmup.min_reward=0.5"],
         "warmup.min_reward=0.5 is read only with a source that plays episodes"),
        (["warmup=sft", "model.lora.enabled=true"], "warmup.source=policy with model.lora.enabled=true"),
        (["warmup=sft", "warmup.steps=0"], "warmup.steps=0 must be at least 1"),
        (["warmup=sft", "warmup.source=replay"], "warmup.source"),
    ],
)  # fmt: skip
def test_a_setting_the_warm_up_cannot_run_with_is_refused_naming_it(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text('{"messages": []}\n')
    with pytest.raises(Exception, match=message) as err:
        resolved_config([*TINY_RUN, *overrides])
    assert "Traceback" not in str(err.value)


def test_a_warm_up_batch_that_the_processes_cannot_share_is_refused_naming_it():
    from grpo_exp.run.resolve import resolve
    from support.config import compose_config

    with pytest.raises(UserError, match="warmup.batch_size=7 is split over the 2 processes that train: give a mult"):
        resolve(compose_config([*TINY_RUN, "warmup=sft", "warmup.batch_size=7"]), processes=2)
    match = r"warmup.micro_batch_size=3 does not divide warmup.batch_size=8 \(the 4 of each of the 2 processes\)"
    with pytest.raises(UserError, match=match):
        resolve(compose_config([*TINY_RUN, "warmup=sft", "warmup.micro_batch_size=3"]), processes=2)
    resolve(compose_config([*TINY_RUN, "warmup=sft", "warmup.micro_batch_size=2"]), processes=2)


def test_without_a_warm_up_no_warm_up_setting_is_read_and_the_default_is_none():
    spec = resolved_config(TINY_RUN)
    assert spec.cfg.warmup.source.value == "none"
    assert resolved_config([*TINY_RUN, "warmup=sft"]).cfg.warmup.source.value == "policy"


# ---- demonstrations ---------------------------------------------------------------------------------------------


def test_the_users_conversations_are_read_in_trls_formats_and_anything_else_is_refused_naming_the_file(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "completion": [
        {"role": "assistant", "content": "2"}]}) + "\n")  # fmt: skip
    assert user_conversations(str(good), "train").kept == 1
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(UserError, match=r"warmup.data=.*wrong.jsonl: its columns are \['answer', 'question'\]"):
        user_conversations(str(wrong), "train")
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(UserError, match=r"warmup.data=.*broken.jsonl: could not be read"):
        user_conversations(str(broken), "train")


def test_a_played_episode_trains_the_players_tokens_only():
    """The prompt and the tools' observations are out of the loss (SFTTrainer's completion_mask)."""
    episode = Episode(prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6, 7], player_mask=[1, 1, 0, 1], text="", reward=1.0)
    assert episode.example() == {"input_ids": [1, 2, 3, 4, 5, 6, 7], "completion_mask": [0, 0, 0, 1, 1, 0, 1]}


def play(seed: int, player) -> tuple[float, list[str]]:
    """A GuessTheNumber game played by `player` from what it reads, as the rollout shows it (<result> tags)."""
    game, transcript, moves = TextArenaGame("GuessTheNumber-v0"), "", []
    game.reset(solution=str(seed))
    for _ in range(6):
        turn = player(transcript, {})
        moves.append(turn)
        if "<move>" not in turn:
            break
        answer = game.move(turn.removeprefix("<move>").removesuffix("</move>"))
        transcript += f"{turn}\n<result>{answer}</result>\n"
    return game.get_reward(), moves


def test_the_guess_the_number_expert_wins_every_game_by_binary_search_and_then_ends_the_episode():
    for seed in range(60):
        reward, moves = play(seed, guess_the_number_expert)
        assert reward == 1.0, (seed, moves)
        assert len(moves) <= 6 and "<move>" not in moves[-1]  # at most 5 guesses, then a turn without a move


# ---- resume: what an attempt left ---------------------------------------------------------------------------------


def test_an_attempt_stopped_after_its_warm_up_or_mid_warm_up_is_one_to_continue(tmp_path):
    run_dir = tmp_path / "runs" / "a"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("trainer: {seed: 1}\n")
    assert find_attempt(tmp_path, {"trainer": {"seed": 1}}) is None
    checkpoint = run_dir / "warmup" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    attempt = find_attempt(tmp_path, {"trainer": {"seed": 1}})
    assert attempt.warmup_checkpoint == checkpoint and not attempt.warmed_up and attempt.checkpoint is None
    (run_dir / "warmup" / "summary.json").write_text("{}")
    assert load_attempt(run_dir).warmed_up


def test_the_warmed_models_weights_load_into_a_fresh_policy_and_another_models_are_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    warmed = LlamaForCausalLM(config)
    warmed.save_pretrained(tmp_path / "model")
    fresh = LlamaForCausalLM(config)
    load_weights(fresh, tmp_path / "model")
    for (name, a), b in zip(warmed.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    other = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 2}))
    with pytest.raises(UserError, match="does not fit this run's model"):
        load_weights(other, tmp_path / "model")


# ---- end to end: the stage really trains, then GRPO -------------------------------------------------------------


def only_run_dir(outputs: Path) -> Path:
    (run_dir,) = [p.parent for p in (outputs / "runs").rglob(".hydra")]
    return run_dir


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.e2e
def test_a_run_stopped_mid_warm_up_continues_from_the_step_it_had_trained(tmp_path):
    """The user's conversations (prompt-completion): a warm-up checkpoint every 4 steps (warmup.save_steps); stopped
    by SIGTERM after its sixth step, it saves the step it stopped at too (as GRPO's stage does), and the resumed run
    trains the steps after it, then GRPO."""
    data = tmp_path / "conversations.jsonl"
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "completion": [{"role": "assistant", "content": f"{i} + {i} = {2 * i}"}],
        }
        for i in range(40)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    outputs = tmp_path / "outputs"
    args = [*TINY_RUN, "logger=none", f"outputs_dir={outputs}", "warmup=sft", "warmup.source=dataset",
            f"warmup.data={data}", "warmup.steps=16", "warmup.save_steps=4", "warmup.batch_size=2"]  # fmt: skip

    def losses_logged(run_dir: Path) -> dict[int, float]:
        metrics = run_dir / "warmup" / "metrics.jsonl"
        lines = read_jsonl(metrics) if metrics.is_file() else []
        return {m["step"]: m["loss"] for m in lines if "loss" in m}

    stopped_after = lambda: any(len(losses_logged(d.parent)) >= 6 for d in outputs.rglob(".hydra"))  # noqa: E731
    assert interrupted_when(args, stopped_after).returncode
    first = only_run_dir(outputs)
    stopped = load_attempt(first)
    assert stopped.warmup_checkpoint is not None and not stopped.warmed_up, "the warm-up ended before the stop"
    trained = max(losses_logged(first))
    saved = sorted(int(p.name.split("-")[1]) for p in (first / "warmup").glob("checkpoint-*"))
    done = int(stopped.warmup_checkpoint.name.split("-")[1])
    assert 4 in saved and done in (trained, trained + 1) and 6 <= done < 16, (saved, trained)

    result = run_cli(*args, "trainer.resume=auto")
    assert result.returncode == 0, result.stderr[-3000:]
    (second,) = [p.parent for p in (outputs / "runs").rglob(".hydra") if p.parent != first]
    assert sorted(losses_logged(second)) == list(range(1, 17))  # those up to the checkpoint carried, the rest trained
    summary = json.loads((second / "summary.json").read_text())
    assert summary["warmup_steps"] == 16 and summary["warmup_demonstrations"] == 40 and summary["steps"] == 2


@pytest.mark.e2e
def test_an_experts_game_episodes_warm_up_the_policy_and_a_run_stopped_after_the_warm_up_does_not_repeat_it(tmp_path):
    """GuessTheNumber through the multi-turn rollout, the expert in the engine's place: every kept demonstration a
    game won. Stopped once the warm-up has ended, the resumed run loads the warmed model and trains GRPO only."""
    outputs = tmp_path / "outputs"
    args = [*GUESS, f"outputs_dir={outputs}", "warmup=sft", "warmup.source=expert", f"warmup.expert={EXPERT}",
            "warmup.steps=1", "warmup.batch_size=2", "warmup.prompts=6", "trainer.max_steps=2"]  # fmt: skip
    assert interrupted_when(args, lambda: any(outputs.rglob("warmup/summary.json"))).returncode
    first = only_run_dir(outputs)
    assert not (first / "summary.json").exists()
    kept = read_jsonl(first / "warmup" / "demonstrations.jsonl")
    assert len(kept) == 6 and all(d["reward"] == 1.0 and "Congratulations" in d["completion"] for d in kept)

    result = run_cli(*args, "trainer.resume=auto")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "the warm-up ended in the earlier attempt" in output and "warm-up: playing" not in output  # not again
    (second,) = [p.parent for p in (outputs / "runs").rglob(".hydra") if p.parent != first]
    summary = json.loads((second / "summary.json").read_text())
    assert summary["warmup_demonstrations"] == 6 and summary["warmup_source"] == "expert" and summary["steps"] == 2
    assert summary["resumed_from"].endswith("warmup") and "heldout_environment_success_before_warmup" in summary


def test_compare_sets_warm_up_and_grpo_beside_grpo_alone_from_the_untrained_model():
    from grpo_exp.analysis.comparison import Run, comparison_rows, result_columns

    common = {"heldout_accuracy_after": 0.5, "train_seconds": 10.0, "diagnosis": []}
    warmed = Run("w", {"warmup": "sft"}, summary=common | {"warmup_source": "expert", "warmup_seconds": 4.0,
                 "heldout_accuracy_before_warmup": 0.2, "heldout_accuracy_before": 0.4})  # fmt: skip
    alone = Run("g", {}, summary=common | {"heldout_accuracy_before": 0.2})
    rows = comparison_rows([warmed, alone], ["warmup"])
    assert [row["held-out before"] for row in rows] == [0.2, 0.2]  # both: the model as loaded
    assert [row["after warm-up"] for row in rows] == [0.4, None] and rows[0]["warm-up s"] == 4.0
    assert {"after warm-up", "warm-up s"} <= set(result_columns(rows))
    assert "after warm-up" not in comparison_rows([alone], [])[0]


@pytest.mark.e2e
def test_the_policys_own_paid_episodes_warm_it_up_under_two_processes_then_grpo_trains_and_both_stages_are_recorded(
    tmp_path,
):
    """accelerate launch with 2 processes (gloo): the 16 episodes are split between the processes and gathered on
    both, SFTTrainer shards the kept ones (each process's 2 a row at a time: warmup.micro_batch_size=1), then GRPO;
    both stages in the run directory, the summary and TensorBoard."""
    from grpo_exp.paths import REPO_ROOT
    from tests.helpers.cli import accelerate_launch

    outputs = tmp_path / "outputs"
    result = accelerate_launch(
        *TINY_RUN, "reward=math+length", "logger=tensorboard", f"outputs_dir={outputs}", "warmup=sft",
        "warmup.steps=2", "warmup.batch_size=4", "warmup.micro_batch_size=1", "warmup.prompts=8",
        "warmup.samples_per_prompt=2", "warmup.min_reward=0.05", "dataset.eval_size=5",
        accelerate_config=REPO_ROOT / "accelerate_configs/ddp.yaml",
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    run_dir = only_run_dir(outputs)
    summary = json.loads((run_dir / "summary.json").read_text())
    kept = read_jsonl(run_dir / "warmup" / "demonstrations.jsonl")
    assert summary["warmup_source"] == "policy" and summary["warmup_played"] == 16  # each process's share, gathered
    assert summary["warmup_demonstrations"] == len(kept) > 0 and all(d["reward"] >= 0.05 for d in kept)
    assert len({d["completion"] for d in kept}) > 1  # the processes' shares, not one share twice
    assert summary["heldout_accuracy_before_warmup"] is not None and summary["heldout_accuracy_before"] is not None
    assert [m["step"] for m in read_jsonl(run_dir / "warmup" / "metrics.jsonl") if "loss" in m] == [1, 2]
    assert (run_dir / "warmup" / "model" / "model.safetensors").is_file()
    assert (run_dir / "eval_before_warmup.jsonl").is_file()
    assert summary["warmup_steps"] == 2 and summary["steps"] == 2 and summary["eval_size"] == 5
    # GRPO's own metrics file holds GRPO's steps only
    assert not any("warmup" in key for m in read_jsonl(run_dir / "metrics.jsonl") for key in m)
    assert "warm-up" in result.stdout and "(warm-up)" in result.stdout  # the printed summary's rows

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run_dir / "tensorboard").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert "train/warmup/loss" in tags and "train/loss" in tags and "train/reward" in tags


def test_the_episodes_change_of_a_warmed_up_run_is_reported_stage_by_stage_and_against_another_run(tmp_path, capsys):
    from benchmarks.episodes_change import main

    def games(path: Path, wins: list[bool]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"environment": "g", "env_success": w}) + "\n" for w in wins))

    warmed, alone = tmp_path / "warmed", tmp_path / "alone"
    games(warmed / "eval_before_warmup.jsonl", [False, False, True, False])
    games(warmed / "eval_before.jsonl", [True, False, True, False])
    games(warmed / "eval_after.jsonl", [True, True, True, False])
    for when in ("before", "after"):
        games(alone / f"eval_{when}.jsonl", [False, False, True, False])
    main([str(warmed)])
    shown = capsys.readouterr().out
    assert "warm-up (eval_before_warmup.jsonl -> eval_before.jsonl):\ng: before 1/4" in shown and "after 2/4" in shown
    assert "warm-up + GRPO (eval_before_warmup.jsonl -> eval_after.jsonl):\ng: before 1/4" in shown
    main([str(warmed), "--against", str(alone)])
    assert "g: before 1/4 [0.046, 0.699], after 3/4" in capsys.readouterr().out
