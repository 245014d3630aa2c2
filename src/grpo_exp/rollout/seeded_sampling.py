"""trainer.seeded_sampling: on vLLM's server, each prompt is sampled from a seed of its own, drawn from the run's
seed, the prompt's tokens and how many times the run has sent that prompt before.

Without it, vLLM draws every sequence it decodes from one generator, so which draw a row gets depends on how its
scheduler happened to batch the requests: two runs of one config and seed differ (two synchronous runs of a seed
answered 70 of 500 held-out problems differently, BENCHMARKS.md). One seed for every request (TRL's
`generation_kwargs={seed: N}`) gives every prompt of every step the same draws. A seed per prompt and occurrence
makes a run reproducible, and two runs that send the same prompts to the same weights (generation ahead at
staleness 0 and the synchronous pipeline) draw the same completions, whatever else the server is doing.
"""

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

# vLLM seeds the n sequences of a request seed, seed + 1, ...: kept within a signed 32-bit int with room for n.
SEED_SPACE = 2**31 - 2**16
MOST_REQUESTS_AT_ONCE = 64  # TRL's own client sends as many at once (its multimodal path)


def prompt_text(prompt: list[int] | str) -> str:
    """A prompt (token ids or text) as one string: its identity for seeding and counting."""
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))


def prompt_seed(run_seed: int, prompt: list[int] | str, occurrence: int) -> int:
    """The seed of the `occurrence`-th request (from 0) of `prompt` (token ids or text) in a run seeded `run_seed`."""
    digest = hashlib.sha256(f"{run_seed}|{occurrence}|{prompt_text(prompt)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_SPACE


class SeededClient:
    """TRL's VLLMClient (`client`) whose `generate` sends each prompt as a request of its own, seeded by prompt_seed,
    all at once (the server batches them as it would one request's prompts); its answer is the client's, prompt by
    prompt in order. Everything else is the client's. Several threads may call it (a multi-turn rollout's turns)."""

    def __init__(self, client, run_seed: int):
        self.client, self.run_seed = client, run_seed
        self.sent: dict[str, int] = {}
        self.counting = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.client, name)

    def seeds(self, prompts: list) -> list[int]:
        """Each prompt's seed, counting this request as one more occurrence of it."""
        seeds = []
        with self.counting:
            for prompt in prompts:
                key = prompt_text(prompt)
                occurrence = self.sent.get(key, 0)
                self.sent[key] = occurrence + 1
                seeds.append(prompt_seed(self.run_seed, prompt, occurrence))
        return seeds

    def generate(self, prompts: list, generation_kwargs: dict | None = None, **params) -> dict:
        seeds = self.seeds(prompts)

        def one(index: int) -> dict:
            kwargs = {**(generation_kwargs or {}), "seed": seeds[index]}
            return self.client.generate(prompts=[prompts[index]], generation_kwargs=kwargs, **params)

        if len(prompts) == 1:
            answers = [one(0)]
        else:
            with ThreadPoolExecutor(max_workers=max(1, min(MOST_REQUESTS_AT_ONCE, len(prompts)))) as pool:
                answers = list(pool.map(one, range(len(prompts))))
        return {key: joined([answer[key] for answer in answers]) for key in answers[0]} if answers else {}


def joined(parts: list[list | None]) -> list | None:
    """The answers' lists of one key end to end; None where the client left it out (log-probabilities not asked)."""
    return None if all(part is None for part in parts) else [item for part in parts for item in part]
