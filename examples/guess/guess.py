"""A small stateful game as an environment in TRL's convention (GRPOTrainer's environment_factory), trained with
grpo_exp's multi-turn loop on any chat template:

    grpo-exp train --config-dir configs +experiment=guess

GuessTheNumber: a secret number from 1 to 20 (the row's answer), found by guessing; each guess is answered
"higher", "lower" or "correct". get_reward() pays 1 for a found number. `rows` makes the
problems; the dataset's answer column holds each one's secret.
"""

import random


class GuessTheNumber:
    """One game per trajectory: grpo_exp makes an instance, resets it with the row, and offers its public methods
    (here `guess`) to the policy as tools."""

    def reset(self, question: str, solution: str, **row) -> str:
        self.secret = int(solution)
        self.guesses = 0
        self.found = False
        return "Call the guess tool, e.g. <guess>10</guess>, and read whether the number is higher or lower."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: your guess, from 1 to 20
        """
        self.guesses += 1
        if number == self.secret:
            self.found = True
            return "correct"
        return "higher" if number < self.secret else "lower"

    def get_reward(self) -> float:
        """1 for finding the number, 0 if it was not found."""
        return 1.0 if self.found else 0.0


def rows(count: int = 300, seed: int = 0) -> dict[str, list[dict]]:
    """Games with seeded secrets: 200 to train on, the rest (100) held out."""
    rng = random.Random(seed)
    games = [
        {"question": "I am thinking of a number from 1 to 20. Find it.", "answer": str(rng.randint(1, 20))}
        for _ in range(count)
    ]
    return {"train": games[:200], "test": games[200:]}
