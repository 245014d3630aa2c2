"""warmup.source=expert: episodes played by the user's expert, f(transcript, row) -> the next turn's text.

In a multi-turn run the expert stands where vLLM's engine would (grpo_exp.rollout.vllm_turns: submit, busy,
finished), so that its turns go through the rollout's own loop: its tool calls run, the environment answers, and the
demonstration is tokenised exactly as the policy's own trajectories are."""

from collections.abc import Callable

from grpo_exp.errors import UserError
from grpo_exp.plugins import call_user, import_callable, signature_of
from grpo_exp.rollout.vllm_turns import Turn, TurnSampling

KEY = "warmup.expert"
WHAT = "the expert, f(transcript: str, row: dict) -> str: the next turn's text given the episode so far"


def load_expert(path: str) -> Callable[[str, dict], str]:
    """The expert at `path`, refused unless it takes (transcript, row)."""
    expert = import_callable(path, KEY, WHAT)
    signature = signature_of(expert)
    if signature is not None:
        try:
            signature.bind("", {})
        except TypeError:
            raise UserError(f"{KEY}={path}: takes {signature}, where {KEY} names {WHAT}") from None
    return expert


def expert_turn(expert: Callable, path: str, transcript: str, row: dict) -> str:
    """One turn of the expert; what it raises or a reply that is not text, one UserError naming warmup.expert."""
    text = call_user(expert, f"{KEY}={path}", transcript, row, given="the transcript so far and the dataset row")
    if not isinstance(text, str):
        raise UserError(f"{KEY}={path} returned {type(text).__name__}, where {KEY} must return the turn's text (str)")
    return text


class ExpertTurns:
    """The expert as a turn engine: each submitted context (the prompt, then the episode so far) answered at once with
    the expert's next turn, ended by EOS (the rollout cuts a turn where its tool call completes)."""

    def __init__(self, expert: Callable, path: str, tokenizer, rows: list[dict]):
        self.expert, self.path, self.tokenizer, self.rows = expert, path, tokenizer, rows
        self.prompt_lengths: dict[int, int] = {}
        self.waiting: list[Turn] = []

    def submit(self, key: int, token_ids: list[int], sampling: TurnSampling) -> None:
        prompt_length = self.prompt_lengths.setdefault(key, len(token_ids))
        transcript = self.tokenizer.decode(token_ids[prompt_length:], skip_special_tokens=True)
        text = expert_turn(self.expert, self.path, transcript, self.rows[key])
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        self.waiting.append(Turn(key, ids, None))

    def busy(self) -> bool:
        return bool(self.waiting)

    def finished(self) -> list[Turn]:
        done, self.waiting = self.waiting, []
        return done
