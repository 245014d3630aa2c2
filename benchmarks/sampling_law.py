"""Does vLLM's CPU sampler draw from the distribution it is given? `python -m benchmarks.sampling_law [DRAWS]`.

In this process, on the embedded model's next-token distribution after an arithmetic question (the chat template),
vLLM's own CPU sampler (TopKTopPSampler, as its CPU model runner builds it) draws DRAWS tokens three ways:
- unseeded: its default, a compiled exponential race whose noise is float32 (-log of a float32 uniform);
- seeded: each row's noise from a generator of its own (trainer.seeded_sampling), eager torch;
- float64 noise, unseeded (vLLM's --use-fp64-gumbel).
The draws are counted by bands of the tokens' probability (the 40 likeliest one by one, then bands down to below
1e-7) against what the distribution expects, with a z for each band and a chi-square over them. A race in float32
noise cannot give a token whose probability is below about 6e-8 of the leader's (the smallest noise is 2^-24) a
win, and draws the tail below it less often: BENCHMARKS.md, vLLM's sampling law.
"""

import argparse
import time

import numpy as np
import torch
from scipy import stats

from support.config import compose_config

QUESTION = "What is 35 + 48? Answer with the number."
LIKELIEST = 40
BANDS = [(1e-3, 1.0), (1e-4, 1e-3), (1e-5, 1e-4), (1e-6, 1e-5), (1e-7, 1e-6), (0.0, 1e-7)]
ROWS = 500  # draws per sampler call: a batch of that many rows of the same distribution


def next_token_logits() -> torch.Tensor:
    """The embedded model's float32 logits for the first token of its answer to QUESTION."""
    from transformers import AutoModelForCausalLM

    from grpo_exp.models import load_tokenizer, materialise_embedded

    cfg = compose_config()
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = AutoModelForCausalLM.from_pretrained(materialise_embedded(cfg.model, cfg.cache_dir), dtype=torch.float32)
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True, return_tensors="pt"
    )
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    with torch.no_grad():
        return model(ids).logits[0, -1].float()


def samplers() -> dict:
    """Each way of drawing: a function of `rows` copies of the logits, returning one token per row."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    float32_noise = TopKTopPSampler("processed_logprobs")
    float64_noise = TopKTopPSampler("processed_logprobs", use_fp64_gumbel=True)
    seeds = iter(range(10**9))

    def seeded(logits):
        generators = {row: torch.Generator().manual_seed(next(seeds)) for row in range(logits.shape[0])}
        return float32_noise(logits, generators, None, None)[0]

    return {
        "unseeded (vLLM's default)": lambda logits: float32_noise(logits, {}, None, None)[0],
        "seeded (trainer.seeded_sampling)": seeded,
        "float64 noise (--use-fp64-gumbel)": lambda logits: float64_noise(logits, {}, None, None)[0],
    }


def band_rows(p: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """The likeliest tokens one by one, then the rest by BANDS of probability: names and token indices."""
    order = np.argsort(-p)
    rest = order[LIKELIEST:]
    names = [f"token {rank + 1}" for rank in range(LIKELIEST)] + [f"p in [{lo:g}, {hi:g})" for lo, hi in BANDS]
    groups = [order[rank : rank + 1] for rank in range(LIKELIEST)]
    groups += [rest[(p[rest] >= lo) & (p[rest] < hi)] for lo, hi in BANDS]
    return names, groups


def law_check(counts: np.ndarray, p: np.ndarray) -> dict:
    """Observed against expected counts by band: each band's z (binomial) and a chi-square over the bands with an
    expected count of 5 or more."""
    names, groups = band_rows(p)
    draws = counts.sum()
    observed = np.array([counts[g].sum() for g in groups])
    expected = np.array([p[g].sum() for g in groups]) * draws
    kept = expected >= 5
    chi = stats.chisquare(observed[kept], expected[kept] * observed[kept].sum() / expected[kept].sum())
    shares = expected / draws
    z = (observed - expected) / np.sqrt(np.maximum(draws * shares * (1 - shares), 1e-12))
    bands = [
        {"band": names[i], "observed": int(observed[i]), "expected": round(float(expected[i]), 1), "z": round(z[i], 2)}
        for i in range(LIKELIEST, len(names))
    ]
    return {"chi2": float(chi.statistic), "df": int(kept.sum() - 1), "p": float(chi.pvalue), "bands": bands}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sampling_law", description=__doc__.split("\n")[0])
    parser.add_argument("draws", nargs="?", type=int, default=100_000, help="tokens drawn by each sampler")
    args = parser.parse_args(argv)
    logits = next_token_logits()
    p = logits.softmax(-1).double().numpy()
    print(f"{QUESTION!r}: {len(p)} tokens, the likeliest {p.max():.4f}; mass below 1e-5 {p[p < 1e-5].sum():.5f}")
    for name, draw in samplers().items():
        started, counts = time.perf_counter(), np.zeros(len(p))
        for _ in range(max(1, args.draws // ROWS)):
            np.add.at(counts, draw(logits.expand(ROWS, -1).clone()).numpy(), 1)
        check = law_check(counts, p)
        print(f"\n{name}: {int(counts.sum())} draws in {time.perf_counter() - started:.0f} s; chi-square over "
              f"{check['df'] + 1} bins {check['chi2']:.1f}, p = {check['p']:.3g}")  # fmt: skip
        for band in check["bands"]:
            drawn, expected = band["observed"], band["expected"]
            print(f"  {band['band']:>18}: {drawn:>7} drawn, {expected:>9} expected, z {band['z']:+.2f}")


if __name__ == "__main__":
    main()
