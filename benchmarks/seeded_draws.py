"""Does vLLM draw differently when each request is seeded (trainer.seeded_sampling) than when none is?
`python -m benchmarks.seeded_draws [REQUESTS] [--port PORT]`.

Against `grpo-exp serve` (started here on the embedded model, or the one on --port): REQUESTS requests of n=8
completions of 16 tokens at temperature 1, over four arithmetic questions in the chat template, first unseeded,
then each with a seed of its own as seeded sampling draws them (grpo_exp.rollout.seeded_sampling.prompt_seed). Prints
the sampled tokens' log-probabilities under the model both ways, with a Welch t test and a Kolmogorov-Smirnov test
each: a sampler whose seeded path drew from another law would show there. BENCHMARKS.md, seeded sampling
(its figures: this script's first version, each request's seed a hash of its index and prompt, as prompt_seed's is
of the run's seed, the prompt and its occurrence).
"""

import argparse
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests
from scipy import stats

from grpo_exp.models import load_tokenizer
from grpo_exp.rollout.seeded_sampling import prompt_seed
from support.config import compose_config
from support.servers import free_port, vllm_server

QUESTIONS = [(12, 7), (35, 48), (9, 61), (77, 14)]
COMPLETIONS, TOKENS = 8, 16


def prompts() -> list[list[int]]:
    cfg = compose_config()
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    messages = [[{"role": "user", "content": f"What is {a} + {b}? Answer with the number."}] for a, b in QUESTIONS]
    encoded = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in messages]
    return [list(e["input_ids"] if hasattr(e, "keys") else e) for e in encoded]  # ids, or an encoding holding them


def draws(url: str, prompt: list[int], seed: int | None) -> list[list[float]]:
    """Each completion's sampled tokens' log-probabilities."""
    body = {"model": "smollm2_135m", "prompt": prompt, "n": COMPLETIONS, "max_tokens": TOKENS, "temperature": 1.0}
    body |= {"logprobs": 0} | ({} if seed is None else {"seed": seed})
    answer = requests.post(url, json=body, timeout=600).json()
    if "choices" not in answer:
        raise SystemExit(f"the server failed: {answer}")
    return [choice["logprobs"]["token_logprobs"] for choice in answer["choices"]]


def sampled(url: str, questions: list[list[int]], requests_sent: int, seeded: bool) -> list[list[float]]:
    asked = [questions[i % len(questions)] for i in range(requests_sent)]
    seeds = [prompt_seed(0, prompt, i) if seeded else None for i, prompt in enumerate(asked)]
    with ThreadPoolExecutor(16) as pool:
        return [c for answer in pool.map(lambda a: draws(url, *a), zip(asked, seeds, strict=True)) for c in answer]


def compare(name: str, unseeded: np.ndarray, seeded: np.ndarray) -> str:
    welch = stats.ttest_ind(unseeded, seeded, equal_var=False).pvalue
    ks = stats.ks_2samp(unseeded, seeded).pvalue
    return (
        f"{name}: unseeded {unseeded.mean():.4f} (n={len(unseeded)}), seeded {seeded.mean():.4f} (n={len(seeded)});"
        f" Welch t p={welch:.3g}; KS p={ks:.3g}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requests", type=int, nargs="?", default=240)
    parser.add_argument("--port", type=int, help="a grpo-exp serve already running (else one is started)")
    args = parser.parse_args()
    questions = prompts()
    port = args.port or free_port()
    with contextlib.nullcontext() if args.port else vllm_server(port):
        url = f"http://127.0.0.1:{port}/v1/completions"
        runs = {}
        for seeded in (False, True):
            start = time.monotonic()
            runs[seeded] = sampled(url, questions, args.requests, seeded)
            took = time.monotonic() - start
            print(f"{'seeded' if seeded else 'unseeded'}: {len(runs[seeded])} completions, {took:.0f} s")
    statistics = {
        "the first token's log-probability": lambda cs: np.array([c[0] for c in cs]),
        "a completion's mean log-probability": lambda cs: np.array([np.mean(c) for c in cs]),
        "every token's log-probability (not independent)": lambda cs: np.concatenate([np.array(c) for c in cs]),
    }
    for name, statistic in statistics.items():
        print(compare(name, statistic(runs[False]), statistic(runs[True])))


if __name__ == "__main__":
    main()
