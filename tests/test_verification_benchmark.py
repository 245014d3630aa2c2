"""The verification benchmark: its statistics hand-computed, its cache, and a model scored on it."""

import json
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoModelForCausalLM

from grpo_exp.measures import auroc, balanced_accuracy, bootstrap_interval
from grpo_exp.models import load_tokenizer
from grpo_exp.run.heldout import verification_benchmark
from grpo_exp.run_files import BENCHMARK_FILE
from grpo_exp.verification.benchmark import (
    benchmark_key,
    benchmark_metrics,
    load_benchmark,
    save_benchmark,
    score_benchmark,
)
from grpo_exp.verification.selfverify import Candidate


def test_auroc_counts_ties_half_and_needs_both_labels():
    assert auroc([0.9, 0.8, 0.3, 0.1], [True, True, False, False]) == 1.0
    assert auroc([0.5, 0.5, 0.5, 0.5], [True, False, True, False]) == 0.5
    assert auroc([0.2, 0.6, 0.6, 0.1], [True, True, False, False]) == pytest.approx(0.625)  # 2.5 of 4 pairs
    assert math.isnan(auroc([0.1, 0.2], [True, True]))


def test_balanced_accuracy_gives_a_constant_verdict_one_half_whatever_the_balance():
    actual = [True] * 19 + [False] * 81
    assert balanced_accuracy([True] * 100, actual) == 0.5  # plain accuracy would be 0.19
    assert balanced_accuracy([False] * 100, actual) == 0.5  # ...or 0.81
    assert balanced_accuracy([True, False, True, True], [True, False, False, False]) == pytest.approx(2 / 3)


def test_the_bootstrap_interval_brackets_the_estimate_and_narrows_with_more_data():
    scores = [0.9, 0.7, 0.6, 0.4, 0.55, 0.3, 0.2, 0.65]
    labels = [True, True, False, True, False, False, False, True]
    low, high = bootstrap_interval(scores, labels, auroc, resamples=500, seed=1)
    assert low <= auroc(scores, labels) <= high and high - low > 0.2
    wide = high - low
    low, high = bootstrap_interval(scores * 25, labels * 25, auroc, resamples=500, seed=1)
    assert low <= auroc(scores, labels) <= high and high - low < wide / 3
    assert bootstrap_interval(scores, labels, auroc, resamples=500, seed=1) == bootstrap_interval(
        scores, labels, auroc, resamples=500, seed=1
    )


def test_benchmark_metrics_of_an_always_yes_verifier():
    metrics = benchmark_metrics([0.9] * 4, [True, False, True, False], resamples=50, seed=0)
    assert metrics["verify_bench/auroc"] == 0.5 and metrics["verify_bench/balanced_accuracy"] == 0.5
    assert metrics["verify_bench/balanced_accuracy_low"] == metrics["verify_bench/balanced_accuracy_high"] == 0.5
    assert metrics["verify_bench/yes_rate"] == 1.0 and metrics["verify_bench/examples"] == 4.0
    assert metrics["verify_bench/brier"] == pytest.approx((0.01 + 0.81) / 2)
    assert metrics["verify_bench/ece"] == pytest.approx(0.4)


EXAMPLES = [
    Candidate(0, "Calculate 2 + 3.", "It is \\boxed{5}", "5", True, 0.5),
    Candidate(0, "Calculate 2 + 3.", "It is \\boxed{6}", "6", False, 0.5),
    Candidate(1, "Calculate 9 - 4.", "\\boxed{5}", "5", True, 1.0),
    Candidate(2, "Calculate 7 + 7.", "\\boxed{15}", "15", False, 0.0),
]


def test_a_benchmark_is_saved_whole_and_read_back(tmp_path):
    path = tmp_path / "bench" / "set.json"
    save_benchmark(EXAMPLES, path)
    assert load_benchmark(path) == EXAMPLES and not path.with_suffix(".partial").exists()


def test_a_process_finds_the_run_directorys_benchmark_whole_or_not_at_all(tmp_path, cfg_train):
    """Every process looks for the run directory's own benchmark while the main process may be writing it there
    from the cache: a 2-process run once read it empty (JSONDecodeError). A reader beside the writes sees no file
    or the whole set, never a part."""
    cfg = cfg_train
    cfg.cache_dir = str(tmp_path / "cache")
    spec, verifier = SimpleNamespace(cfg=cfg, eval_max_new_tokens=16), SimpleNamespace(answer_rule="stated")
    key = benchmark_key(cfg.eval.verification_benchmark, cfg.model, cfg.dataset, 16, cfg.verifier.labels, "stated")
    examples = EXAMPLES * 5_000  # large enough that a write not made whole is caught in the middle
    save_benchmark(examples, Path(cfg.cache_dir) / "verification_benchmark" / f"{key}.json")
    own, seen, written = tmp_path / "run" / BENCHMARK_FILE, [], threading.Event()
    own.parent.mkdir()

    def read_as_another_process_does():
        while not written.is_set():
            if own.is_file():
                try:
                    seen.append(len(load_benchmark(own)))
                except json.JSONDecodeError:
                    seen.append("a part")
                except FileNotFoundError:  # removed by the loop below, before its next write
                    pass

    reader = threading.Thread(target=read_as_another_process_does)
    reader.start()
    try:
        for _ in range(3):  # each write a chance to catch a part
            own.unlink(missing_ok=True)
            assert verification_benchmark(spec, None, None, None, None, verifier, own.parent) == examples
        # the last write stays: the reader reads it at least once, however the threads were scheduled
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        written.set()
        reader.join()
    assert seen and set(seen) == {len(examples)}


def test_a_model_is_scored_on_the_benchmark_by_its_p_yes(tiny_model_dirs, cfg_train):
    cfg = cfg_train
    cfg.eval.verification_benchmark.resamples = 50
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs(seed=0))
    bench_cfg = cfg.eval.verification_benchmark
    metrics = score_benchmark(model, tokenizer, EXAMPLES, bench_cfg, batch_size=4)
    assert metrics["verify_bench/examples"] == 4.0
    assert metrics["verify_bench/auroc_low"] <= metrics["verify_bench/auroc"] <= metrics["verify_bench/auroc_high"]
    assert 0.0 <= metrics["verify_bench/yes_rate"] <= 1.0 and 0.0 <= metrics["verify_bench/brier"] <= 1.0
