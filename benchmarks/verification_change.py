"""How much a run changed the policy's verification ability, paired: `python -m benchmarks.verification_change
<run dir> [<run dir> ...] [--benchmark <verification benchmark .json>]`.

Each run directory's verification benchmark (verification_benchmark.json), or the one given with --benchmark
(e.g. a cached set built with other settings, to score older runs on it), is scored by the initial policy
(model=smollm2_135m, the presets' default) and by the run's final checkpoint; the AUROC change gets a paired
percentile-bootstrap 95% interval (the same resampled examples for both), tighter than comparing the two
unpaired intervals in summary.json. Needs the checkpoint (save_model=true, the default).
"""

import argparse
import random
import sys
from pathlib import Path

from grpo_exp.measures import auroc
from grpo_exp.models import load_model, load_tokenizer, model_option_config
from grpo_exp.run_files import BENCHMARK_FILE, FINAL_CHECKPOINT_DIR
from grpo_exp.verification.benchmark import benchmark_metrics, load_benchmark
from grpo_exp.verification.p_yes import policy_p_yes
from support.config import resolved_config
from support.environment import hub_offline

RESAMPLES = 2000


def p_yes(model_cfg, bench_cfg, cache_dir: str, examples) -> list[float]:
    tokenizer = load_tokenizer(model_cfg, cache_dir)
    model = load_model(model_cfg, tokenizer, cache_dir, seed=0).eval()
    scorer = policy_p_yes(model, tokenizer, batch_size=64, template=bench_cfg.template)
    return scorer([c.question for c in examples], [c.answer or "" for c in examples])


def paired_change(before: list[float], after: list[float], labels: list[bool], seed: int = 0) -> tuple[float, float]:
    rng, changes = random.Random(seed), []
    for _ in range(RESAMPLES):
        picks = [rng.randrange(len(labels)) for _ in labels]
        resampled = [labels[i] for i in picks]
        if any(resampled) and not all(resampled):
            changes.append(auroc([after[i] for i in picks], resampled) - auroc([before[i] for i in picks], resampled))
    changes.sort()
    return changes[int(0.025 * len(changes))], changes[int(0.975 * len(changes))]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.verification_change", description=__doc__)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--benchmark", type=Path, help="score every run on this set instead of its own")
    args = parser.parse_args(argv)
    missing = [str(p) for p in [args.benchmark] if p and not p.is_file()]
    missing += [str(d) for d in args.run_dirs if not (d / FINAL_CHECKPOINT_DIR).is_dir()]
    if missing:
        parser.error(f"not found: {', '.join(missing)} (a set's .json; run dirs with {FINAL_CHECKPOINT_DIR}/)")
    hub_offline()  # the models are local (the embedded one, run checkpoints): fail fast on any hub lookup
    cfg = resolved_config(["+experiment=selfverify"]).cfg
    bench_cfg = cfg.eval.verification_benchmark
    initial = {}  # the initial policy's P(Yes), once per set (runs of one benchmark share it)
    for run_dir in args.run_dirs:
        examples = load_benchmark(args.benchmark or run_dir / BENCHMARK_FILE)
        labels = [c.correct for c in examples]
        key = tuple((c.question, c.answer) for c in examples)
        if key not in initial:
            initial[key] = p_yes(cfg.model, bench_cfg, cfg.cache_dir, examples)
        before = initial[key]
        after = p_yes(model_option_config(str(run_dir), "run"), bench_cfg, cfg.cache_dir, examples)
        low, high = paired_change(before, after, labels)
        first, last = auroc(before, labels), auroc(after, labels)
        print(
            f"{run_dir}: {len(examples)} examples, AUROC {first:.3f} -> {last:.3f}, change {last - first:+.3f}, "
            f"paired 95% [{low:+.3f}, {high:+.3f}]"
        )
        # The checkpoint's other measures on this set, as summary.json would hold them.
        measures = benchmark_metrics(after, labels, bench_cfg.resamples, bench_cfg.seed)
        print("  after: " + ", ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in measures.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
