"""TextArena's single-player games (the `textarena` package) as environments in TRL's convention, offline:

    python -m grpo_exp.train +experiment=textarena_guess          # GuessTheNumber-v0 on the embedded model
    python -m grpo_exp.train +experiment=textarena_guess rollout.environment=textarena/Mastermind-v0   # another

Each episode is one game, made and reset with its row's seed (the row's answer: `episodes` makes seeded rows). The
game's own instructions join the user message; the policy plays with the `move` tool, `<move>[10]</move>`, whose
text is the game's action in the format the game asks for, and reads what the game answers. When the game ends,
its reward (TextArena's: 1 for a win; some games give partial credit) is get_reward(); a game the policy did not
finish within rollout.max_turns scores 0.

Run offline here (textarena 0.7.4, Python 3.11; `tests/test_textarena.py` plays each): SINGLE_PLAYER_OFFLINE. Not
offline: Hangman, Wordle, WordLadder, WordSearch, SpellingBee (nltk corpora, downloaded at first use);
TwentyQuestions, GuessWho (an OpenRouter API key); Checkers, Chess, Klondike (their code needs Python 3.12).
"""

import functools
import math
import re
from dataclasses import dataclass

from omegaconf import DictConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.environments.schemes import environment_scheme
from grpo_exp.errors import UserError

PREFIX = "textarena/"
SECTION = "rollout.textarena"  # TextArenaSettings, as the run's schema holds them (grpo_exp.environments.schemes)
SINGLE_PLAYER_OFFLINE = (
    "2048-v0",
    "Bandit-v0",
    "Blackjack-v0",
    "Countdown-v0",
    "Crosswords-v0",
    "Cryptarithm-v0",
    "FifteenPuzzle-v0",
    "FrozenLake-v0",
    "GuessTheNumber-v0",
    "LightsOut-v0",
    "LogicPuzzle-v0",
    "Mastermind-v0",
    "Minesweeper-v0",
    "PegJump-v0",
    "RushHour-v0",
    "Secretary-v0",
    "Set-v0",
    "Slitherlink-v0",
    "Sokoban-v0",
    "Sudoku-v0",
    "ThreeCardMonte-v0",
    "TowerOfHanoi-v0",
)


@dataclass
class TextArenaSettings:
    """TextArena's own settings, rollout.textarena.* (read only with rollout.environment=textarena/<game>)."""

    # a game ended by an invalid move scores 0; true: TextArena's own partial credit for it (GuessTheNumber pays how
    # close the guesses came)
    invalid_move_credit: bool = False
    # GuessTheNumber-v0 only: each guess paid, as a step reward, the share of the search it narrowed (the log of the
    # range the hints leave, potential-based: a game won totals 1, a game unfinished less; a repeated or uninformative
    # guess earns 0, and a game ended by an invalid move gives all of it back: ending a game never pays)
    shaped: bool = False


MOVE = re.compile(r"<move>\s*\[(\d+)\]\s*</move>")
HINT = re.compile(r"\b(higher|lower)\b", re.IGNORECASE)
SHAPED_GAMES = ("GuessTheNumber-v0",)  # the games rollout.textarena.shaped has step rewards for
GUESS_RANGE = (1, 20)  # GuessTheNumber-v0's


def candidates_left(low: int, high: int, guess: int, answer: str) -> tuple[int, int]:
    """GuessTheNumber's candidates after the game answered `guess` with `answer`: its hint ("higher" / "lower")
    narrows [low, high]; an answer without a hint leaves it as it was."""
    hint = HINT.search(answer)
    if hint is None:
        return low, high
    return (max(low, guess + 1), high) if hint.group(1).lower() == "higher" else (low, min(high, guess - 1))


def narrowed(low: int, high: int) -> float:
    """How much of GuessTheNumber's search a range of candidates left means done: 0 for the whole range, 1 for one
    number (the potential the shaped step rewards are differences of)."""
    whole = GUESS_RANGE[1] - GUESS_RANGE[0] + 1
    return 1.0 - math.log(max(high - low + 1, 1)) / math.log(whole)


class TextArenaGame:
    """One TextArena game per episode, played by the `move` tool; `shaped` (GuessTheNumber): step rewards."""

    def __init__(self, game_id: str, invalid_move_credit: bool = False, shaped: bool = False):
        self.game_id, self.env, self.shown, self.reward = game_id, None, "", None
        self.invalid_move_credit, self.shaped = invalid_move_credit, shaped
        self.step_rewards: list[float] = []  # what each move earned (shaped only; grpo_exp's per-turn credit reads it)
        self.low, self.high = GUESS_RANGE

    def reset(self, question: str = "", solution: str = "0", **row) -> str:
        import textarena

        self.env = textarena.make(self.game_id)
        self.env.reset(num_players=1, seed=int(solution))
        self.reward, self.step_rewards, (self.low, self.high) = None, [], GUESS_RANGE
        _, observation = self.env.get_observation()
        self.shown = observation
        return observation.strip()

    def move(self, action: str) -> str:
        """Make your move in the game: the action, written as the game asks (e.g. [10]).

        Args:
            action: your move, in the game's format
        """
        if self.reward is not None:
            return "The game is over."
        before = sum(self.step_rewards)
        done, _ = self.env.step(action)
        if done:
            rewards, info = self.env.close()
            player = (info or {}).get(0)
            player = player if isinstance(player, dict) else {}
            invalid = bool(player.get("invalid_move")) and not self.invalid_move_credit
            self.reward = 0.0 if invalid else float((rewards or {}).get(0, 0.0))
            if self.shaped:  # won: all of the search; ended badly: none of it; else (out of turns): what was narrowed
                self.reward = 1.0 if self.reward == 1.0 else 0.0 if invalid else narrowed(self.low, self.high)
                self.step_rewards.append(self.reward - before)
            return f"Game over. {player.get('reason', '')}".strip()
        _, observation = self.env.get_observation()
        new = observation[len(self.shown) :] if observation.startswith(self.shown) else observation
        self.shown = observation
        # what the game answered, without its echo of the move ("[Player] [10]")
        answer = "\n".join(line for line in new.strip().splitlines() if not line.startswith("[Player]"))
        if self.shaped:
            self._narrow(action, answer)
            self.step_rewards.append(narrowed(self.low, self.high) - before)
        return answer

    def _narrow(self, action: str, answer: str) -> None:
        """The candidates the game's hint to this guess leaves (an answer without a hint leaves them as they were)."""
        guess = re.search(r"\[(-?\d+)\]", action)
        if guess is not None:
            self.low, self.high = candidates_left(self.low, self.high, int(guess.group(1)), answer)

    def get_reward(self) -> float:
        if self.shaped:  # the return the step rewards are parts of, a game unfinished within rollout.max_turns too
            return sum(self.step_rewards)
        return 0.0 if self.reward is None else self.reward


@environment_scheme(PREFIX, settings=TextArenaSettings)  # rollout.textarena.*
def game(game_id: str, invalid_move_credit: bool = False, shaped: bool = False) -> functools.partial:
    """The factory of a game by its TextArena id (rollout.environment=textarena/<id>); `invalid_move_credit`: a game
    ended by an invalid move keeps TextArena's partial credit (else it scores 0); `shaped`: step rewards."""
    try:
        import textarena  # noqa: F401
    except ImportError as err:
        raise UserError(f"rollout.environment={PREFIX}{game_id} needs the textarena package: {err}") from None
    from textarena.envs.registration import ENV_REGISTRY

    if game_id not in ENV_REGISTRY:
        raise UserError(
            f"rollout.environment={PREFIX}{game_id}: no such TextArena game; single-player games that run offline: "
            f"{', '.join(SINGLE_PLAYER_OFFLINE)}"
        )
    if shaped and game_id not in SHAPED_GAMES:
        raise UserError(
            f"rollout.textarena.shaped=true: shaped step rewards are written for {', '.join(SHAPED_GAMES)} only, not "
            f"{game_id}: leave rollout.textarena.shaped out"
        )
    factory = functools.partial(TextArenaGame, game_id, invalid_move_credit, shaped)
    factory.__name__ = game_id  # the environment's name in the metrics
    return factory


def guess_the_number_expert(transcript: str, row: dict) -> str:
    """An expert for GuessTheNumber-v0 (warmup.source=expert): binary search over 1-20, narrowed by each of its
    guesses and the hint the game answered it with; never more than 5 guesses. It reads only what the policy reads;
    once the game is over it ends the episode with a turn that makes no move."""
    if "Game over" in transcript:
        return "The game is over."
    low, high = GUESS_RANGE
    moves = list(MOVE.finditer(transcript))
    for move, after in zip(moves, [*moves[1:], None], strict=False):  # each move, and the next (None: the last)
        answer = transcript[move.end() : after.start() if after else len(transcript)]
        low, high = candidates_left(low, high, int(move.group(1)), answer)
    return f"<move>[{(low + high) // 2}]</move>"


def episodes(count: int = 300, held_out: int = 100, seed: int = 0) -> dict[str, list[dict]]:
    """Seeded games (dataset=function dataset.function=grpo_exp.environments.textarena:episodes): each row's answer
    is the seed its game is reset with; the last `held_out` are held out."""
    rows = [{"question": "Play the game.", "answer": str(seed * 1_000_003 + i)} for i in range(count)]
    return {"train": rows[:-held_out], "test": rows[-held_out:]}


def _plays_textarena(cfg: DictConfig) -> bool:
    """Whether rollout.environment names a TextArena game (one path, or one of a mapping's)."""
    setting = cfg.rollout.environment
    paths = [setting] if isinstance(setting, str) else list(setting.values()) if setting else []
    return any(str(path).startswith(PREFIX) for path in paths)


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        (SECTION,),  # each of its settings
        _plays_textarena,
        "by TextArena's games (rollout.environment=textarena/<game>)",
        lambda cfg: f"rollout.environment={cfg.rollout.environment} plays no TextArena game",
        "set rollout.environment=textarena/<game>",
    ),
)
