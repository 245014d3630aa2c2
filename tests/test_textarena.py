"""TextArena's single-player games as environments (grpo_exp.environments.textarena), offline: every game the module
lists plays here, a won game pays TextArena's 1, an unfinished one 0, an unknown game is refused with the list."""

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
