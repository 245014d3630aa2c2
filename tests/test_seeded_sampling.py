"""trainer.seeded_sampling: each prompt sent to vLLM's server is sampled from a seed of its own (the client's
requests here; the server itself in tests/test_vllm.py's staleness-0 test, two runs on one server)."""

import threading

import pytest
import torch

from grpo_exp.errors import UserError
from grpo_exp.rollout.seeded_sampling import SEED_SPACE, SeededClient, prompt_seed
from grpo_exp.run.inert import check_only_with
from grpo_exp.trainer.config import check_trainer
from support.config import TINY_RUN, compose_config


class RecordingClient:
    """TRL's VLLMClient's generate, answering each prompt with its seed as the completion's one token (n copies)."""

    base_url = "http://server"

    def __init__(self):
        self.requests: list[tuple[list, dict]] = []
        self.lock = threading.Lock()

    def generate(self, prompts, n=1, generation_kwargs=None, **params):
        with self.lock:
            self.requests.append((prompts, dict(generation_kwargs or {}), {"n": n, **params}))
        seed = (generation_kwargs or {}).get("seed")
        asked = params.get("logprobs") is not None  # TRL's client answers None for them otherwise
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": [[seed + i] for p in prompts for i in range(n)],
            "logprobs": [[-1.0] for p in prompts for i in range(n)] if asked else None,
            "logprob_token_ids": [[[0]] for p in prompts for i in range(n)] if asked else None,
        }


def test_each_prompt_is_a_request_of_its_own_seeded_by_the_run_the_prompt_and_its_occurrence():
    client = RecordingClient()
    seeded = SeededClient(client, run_seed=42)
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3]]
    answer = seeded.generate(prompts=prompts, n=2, temperature=1.0, logprobs=0, generation_kwargs={"stop": ["x"]})
    assert sorted(map(str, (r[0] for r in client.requests))) == sorted(map(str, ([p] for p in prompts)))
    assert all(r[1]["stop"] == ["x"] and r[2] == {"n": 2, "temperature": 1.0, "logprobs": 0} for r in client.requests)
    expected = [prompt_seed(42, [1, 2, 3], 0), prompt_seed(42, [4, 5], 0), prompt_seed(42, [1, 2, 3], 1)]
    # answered in the prompts' order, each prompt's n completions together
    assert answer["prompt_ids"] == prompts
    assert answer["completion_ids"] == [[s + i] for s in expected for i in range(2)]
    assert len(answer["logprobs"]) == len(answer["logprob_token_ids"]) == 6
    assert len(set(expected)) == 3  # a prompt sent again is drawn afresh
    # the next request of the same prompt is its third occurrence; without log-probabilities asked, none answered
    again = seeded.generate(prompts=[[1, 2, 3], [4, 5]], n=1, logprobs=None)
    assert again["completion_ids"] == [[prompt_seed(42, [1, 2, 3], 2)], [prompt_seed(42, [4, 5], 1)]]
    assert again["logprobs"] is None and again["logprob_token_ids"] is None


def test_the_seeds_are_the_same_in_another_run_of_the_seed_and_differ_with_the_seed():
    prompts = [[7, 8, 9], "a prompt as text"]
    first, second, other = (SeededClient(RecordingClient(), s) for s in (42, 42, 43))
    assert first.seeds(prompts) == second.seeds(prompts) != other.seeds(prompts)
    assert all(0 <= s < SEED_SPACE for s in first.seeds(prompts))


def test_threads_sending_the_same_prompt_get_distinct_occurrences():
    seeded = SeededClient(RecordingClient(), 0)
    seeds = []

    def send():
        seeds.extend(seeded.seeds([[1]] * 50))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seeds) == sorted(prompt_seed(0, [1], k) for k in range(200))


SERVER = ["generation=vllm_server"]


def test_a_seed_for_every_request_is_refused_with_seeded_sampling_naming_both_keys():
    cfg = compose_config(
        [*TINY_RUN, *SERVER, "trainer.seeded_sampling=true", "+trainer.extra.generation_kwargs={seed:1234}"]
    )
    with pytest.raises(UserError, match=r"trainer.extra.generation_kwargs.seed=1234 with trainer.seeded_sampling"):
        check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32)
    cfg = compose_config([*TINY_RUN, *SERVER, "+trainer.extra.generation_kwargs={seed:1234}"])
    cfg.trainer.seeded_sampling = False
    check_trainer(
        cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32
    )  # one seed for every request, as the user asked


@pytest.mark.parametrize(
    ("generation", "named"),
    [("transformers", "generation=transformers"), ("vllm_colocate", "generation=vllm_colocate")],
)
def test_seeded_sampling_given_where_no_server_samples_is_refused(generation, named):
    cfg = compose_config([*TINY_RUN, f"generation={generation}", "trainer.seeded_sampling=true"])
    with pytest.raises(UserError, match=rf"trainer.seeded_sampling=true is read only where vLLM's server.*{named}"):
        check_only_with(cfg)
    check_only_with(compose_config([*TINY_RUN, "generation=vllm_async", "trainer.seeded_sampling=true"]))
