"""TextArena's single-player games as environments (grpo_exp.environments.textarena), offline: every game the module
lists plays here, a won game pays TextArena's 1, an unfinished one 0, an unknown game is refused with the list."""

import math

import pytest

from grpo_exp.environments.textarena import SINGLE_PLAYER_OFFLINE, TextArenaGame, episodes, game
from grpo_exp.errors import UserError
from grpo_exp.rollout.environment import load_environments


@pytest.mark.parametrize("game_id", SINGLE_PLAYER_OFFLINE)
def test_every_listed_game_plays_offline(game_id):
    played = TextArenaGame(game_id)
    assert played.reset("Play the game.", "3").strip(), "the game's instructions join the prompt"
    answer = played.move("[1]")  # a move in some games' format, invalid in others': the game answers either way
    assert isinstance(answer, str)
    assert isinstance(played.get_reward(), float)


def test_guess_the_number_won_by_bisection_pays_one_and_unfinished_pays_zero():
    played = TextArenaGame("GuessTheNumber-v0")
    played.reset("Play the game.", "11")
    low, high, answer = 1, 20, ""
    while played.reward is None:
        guess = (low + high) // 2
        answer = played.move(f"[{guess}]")
        if "higher" in answer:
            low = guess + 1
        elif "lower" in answer:
            high = guess - 1
    assert answer.startswith("Game over.") and played.get_reward() == 1.0
    assert "[Player]" not in answer, "the game's echo of the move is not shown back"
    unfinished = TextArenaGame("GuessTheNumber-v0")
    unfinished.reset("Play the game.", "11")
    unfinished.move("[1]")
    assert unfinished.get_reward() == 0.0


def test_a_game_is_an_environment_by_its_id_and_an_unknown_one_is_refused():
    (environment,) = load_environments("textarena/GuessTheNumber-v0", 5.0).values()
    assert environment.name == "GuessTheNumber-v0" and environment.tool_names == ("move",) and environment.has_reward
    with pytest.raises(UserError, match="no such TextArena game; single-player games that run offline: 2048-v0"):
        game("Nope-v0")


def test_episodes_are_seeded_rows_with_held_out_games():
    split = episodes(count=10, held_out=4)
    assert len(split["train"]) == 6 and len(split["test"]) == 4
    seeds = [row["answer"] for row in split["train"] + split["test"]]
    assert len(set(seeds)) == 10


@pytest.mark.parametrize("credit", [False, True])
def test_a_game_ended_by_an_invalid_move_pays_nothing_unless_its_partial_credit_is_asked_for(credit):
    """GuessTheNumber pays a game ended by invalid moves by how close the guesses came: the exploit the policy found
    (experiments/README.md). By default that ending scores 0; rollout.textarena.invalid_move_credit=true keeps
    TextArena's."""
    played = TextArenaGame("GuessTheNumber-v0", invalid_move_credit=credit)
    played.reset("Play the game.", "11")
    played.move("[10]")  # one guess off by one: a large partial credit
    answer = ""
    while played.reward is None:
        answer = played.move("no number")  # invalid, until the game's error allowance is spent
    assert "Invalid" in answer
    assert (played.get_reward() > 0.0) is credit


@pytest.mark.parametrize(("pays", "expected"), [("reward", [1.0, 0.4, None, 0.0]), ("success", [1.0, 0.0, None, 0.0])])
def test_the_environment_reward_pays_the_game_or_only_a_game_won(pays, expected):
    from grpo_exp.rewards.environment import make_environment_reward

    reward = make_environment_reward(pays)
    env_reward, env_success = [1.0, 0.4, None, 0.0], [True, False, False, False]  # won, partial, failed, lost
    assert reward(completions=[""] * 4, env_reward=env_reward, env_success=env_success) == expected


# the old key (rollout.invalid_move_credit) still works, translated with a warning (grpo_exp.deprecated)
@pytest.mark.parametrize("typed", ["rollout.textarena.invalid_move_credit", "rollout.invalid_move_credit"])
def test_invalid_move_credit_without_a_textarena_game_is_refused_as_unused(typed):
    from grpo_exp.deprecated import translate_overrides
    from grpo_exp.run.inert import check_only_with
    from support.config import compose_config

    cfg = compose_config(translate_overrides(["rollout=multiturn", "rollout.tools=[calculator]", f"{typed}=true"]))
    with pytest.raises(UserError) as refused:
        check_only_with(cfg)
    assert str(refused.value) == (
        "rollout.textarena.invalid_move_credit=true is read only by TextArena's games "
        "(rollout.environment=textarena/<game>), but rollout.environment=None plays no TextArena game: set "
        "rollout.environment=textarena/<game>, or leave rollout.textarena.invalid_move_credit out"
    )


def test_a_games_own_settings_reach_it_from_their_section():
    from support.config import compose_config

    overrides = ["rollout=environment", "rollout.environment=textarena/GuessTheNumber-v0"]
    for credit in (False, True):
        cfg = compose_config([*overrides, f"rollout.textarena.invalid_move_credit={credit}"])
        (environment,) = load_environments(cfg.rollout.environment, 5.0, cfg.rollout).values()
        assert environment.factory().invalid_move_credit is credit


def test_shaped_guess_the_number_pays_each_guess_the_search_it_narrowed_and_ending_a_game_badly_never_pays():
    """rollout.textarena.shaped: potential-based step rewards (the log of the candidates left): a game won totals 1
    however it was won, a repeated or uninformative guess earns nothing, a game unfinished keeps what its guesses
    narrowed, and a game ended by invalid moves gives all of it back."""
    won = TextArenaGame("GuessTheNumber-v0", shaped=True)
    won.reset("Play the game.", "11")
    assert won.env.state.game_state["game_number"] == 15  # the seed's number: the guesses below are around it
    won.move("[10]")  # higher: 11-20 left, 10 of 20 candidates
    assert won.step_rewards == [pytest.approx(1 - math.log(10) / math.log(20))]
    won.move("[10]")  # the same guess again: nothing new narrowed
    assert won.step_rewards[-1] == 0.0
    won.move("[17]")  # lower: 11-16 left
    assert won.get_reward() == pytest.approx(1 - math.log(6) / math.log(20))
    won.move("[15]")
    assert won.reward is not None and won.get_reward() == pytest.approx(1.0) == sum(won.step_rewards)

    unfinished = TextArenaGame("GuessTheNumber-v0", shaped=True)
    unfinished.reset("Play the game.", "11")
    unfinished.move("[13]")  # higher: 14-20 left
    assert unfinished.get_reward() == pytest.approx(1 - math.log(7) / math.log(20))

    ended = TextArenaGame("GuessTheNumber-v0", shaped=True)
    ended.reset("Play the game.", "11")
    ended.move("[10]")
    while ended.reward is None:
        ended.move("no number")
    assert ended.get_reward() == 0.0 and ended.step_rewards[-1] < 0  # what the guess earned, given back

    plain = TextArenaGame("GuessTheNumber-v0")
    plain.reset("Play the game.", "11")
    plain.move("[10]")
    assert plain.step_rewards == [] and plain.get_reward() == 0.0


def test_shaped_rewards_reach_the_game_from_their_setting_and_another_game_is_refused_naming_it():
    from support.config import compose_config

    cfg = compose_config(
        ["rollout=environment", "rollout.environment=textarena/GuessTheNumber-v0", "rollout.textarena.shaped=true"]
    )
    (environment,) = load_environments(cfg.rollout.environment, 5.0, cfg.rollout).values()
    assert environment.factory().shaped is True
    with pytest.raises(UserError, match="rollout.textarena.shaped=true: shaped step rewards are written for Guess"):
        game("Mastermind-v0", shaped=True)
