"""The findings: each a pure rule over a run's records (RunEvidence) that says what was seen (the number behind it,
with its 95% interval where it is a rate or a change), why it matters, and the settings to try, as overrides to
paste. A rule stays silent where its evidence is missing or within noise."""

import dataclasses
import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass

from grpo_exp.analysis.alarms import MAX_COMPLETION, MAX_TURN, TURN_CUT, entropy_alarm, truncation_warning
from grpo_exp.analysis.diagnosis.evidence import RunEvidence
from grpo_exp.answers import BUILT_IN, final_sentence, lenient_match, normalise_answer, vote_key
from grpo_exp.measures import paired_change, problems_to_resolve, slope_interval, wilson_interval
from grpo_exp.schema import TrainerSchema

ZERO_STD = "frac_reward_zero_std"  # TRL's: the share of groups whose rewards have no spread
NO_SIGNAL_SHARE = 0.75  # most groups without spread: the 95% interval of their share above this
MISREAD_SHARE = 0.1  # answers right by content and wrong by the labels: the 95% interval above this share
COLLAPSE_SHARE = 0.6  # one answer to most problems: the 95% interval of its share above this
# Rules that read a word answer from a sentence, tried in turn on answers the labels miss (which would read them).
WORD_RULES = ("phrase", "stated_in_sentence", "answer_is", "boxed", "answer_tags", "last_line")


@dataclass(frozen=True)
class Finding:
    name: str
    seen: str  # what was seen, with its numbers
    why: str  # why that matters, one sentence
    tries: tuple[str, ...] = ()  # the settings to try: overrides to paste, or a short instruction

    def row(self) -> dict:
        return asdict(self) | {"tries": list(self.tries)}

    def lines(self) -> list[str]:
        return [f"{self.name}: {self.seen}", f"  why: {self.why}", *(f"  try: {t}" for t in self.tries)]


def _rate(count: int, total: int) -> str:
    low, high = wilson_interval(count, total)
    return f"{count}/{total} ({count / total:.0%}, 95% [{low:.2f}, {high:.2f}])"


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- the answers and their labels -------------------------------------------------------------------------------


def answer_outcome(sample: dict) -> float | None:
    """A held-out sample's outcome: an environment's episode won (1/0), else its label (1/0), None: not judged."""
    if sample.get("environment") is not None:
        return float(bool(sample.get("env_success")))
    label = sample.get("correct")
    return None if label is None else float(bool(label))


def misread_answers(samples: list[dict]) -> tuple[list[dict], int]:
    """The judged answers whose final sentence holds the reference while the run's labels call them wrong, and how
    many answers were judged."""
    judged = [s for s in samples if s.get("correct") is not None and s.get("solution") is not None]
    missed = [s for s in judged if not s["correct"] and lenient_match(s.get("completion", ""), str(s["solution"]))]
    return missed, len(judged)


def rule_that_reads(samples: list[dict], other_than: str | None = None) -> tuple[str, int] | None:
    """The built-in word rule (other than the run's own) that reads the most of these answers as their reference,
    and how many (None: none)."""
    best = None
    for name in (rule for rule in WORD_RULES if rule != other_than):
        read = sum(
            (answer := BUILT_IN[name](s.get("completion", ""))) is not None
            and normalise_answer(answer) == normalise_answer(str(s["solution"]))
            for s in samples
        )
        if read and (best is None or read > best[1]):  # ties: the first (phrase tries the others in turn)
            best = (name, read)
    return best


def labels_misread(evidence: RunEvidence, samples: list[dict] | None = None) -> Finding | None:
    """The labels and the content check disagree: many answers state the reference in their final sentence yet are
    labelled wrong, so the answer rule (verifier.answer) probably misreads the task. Reads the answers before
    training (else after), or `samples`."""
    samples = samples if samples is not None else (evidence.before or evidence.after)
    missed, judged = misread_answers(samples)
    if judged < 5 or len(missed) < 3 or not wilson_interval(len(missed), judged)[0] > MISREAD_SHARE:
        return None
    rule = evidence.summary.get("answer") or evidence.setting("verifier.answer", "?")
    examples = "; ".join(
        f'"{_short(final_sentence(s["completion"]), 70)}" read as {s.get("answer")!r}, reference {s["solution"]!r}'
        for s in missed[:3]
    )
    reader = rule_that_reads(missed, other_than=rule)
    tries = []
    if reader is not None:
        tries.append(f"verifier.answer={reader[0]}   # reads {reader[1]} of these {len(missed)} as their reference")
    tries += [
        'dataset.prompt.template="{question} Reply with the answer only."',
        "verifier.labels=my_labels:is_correct   # your own f(completion, solution) -> bool | None",
    ]
    return Finding(
        "labels_misread",
        f"{_rate(len(missed), judged)} answers state the reference in their final sentence but the labels "
        f"({evidence.setting('verifier.labels', '?')}, answers read by {rule}) call them wrong; e.g. {examples}",
        "the reward and every accuracy follow these labels: answers right in content score as wrong, so a group "
        "rarely has a spread and the run cannot learn what it should",
        tuple(tries),
    )


# ---- the learning signal ----------------------------------------------------------------------------------------


def no_signal(evidence: RunEvidence) -> Finding | None:
    """Most groups had no reward spread (TRL's frac_reward_zero_std), so their advantages were 0 and nothing was
    learned from them; says whether they were all wrong (too hard), all right (too easy), or all paid one value."""
    shares = evidence.series(ZERO_STD)
    if not shares:
        return None
    per_step = evidence.prompts_per_step
    total = per_step * len(shares)
    flat = round(sum(shares) * per_step)
    if not (flat == total >= 4 or wilson_interval(flat, total)[0] > NO_SIGNAL_SHARE):  # none, or most beyond noise
        return None
    all_wrong, all_right = (
        statistics.fmean(evidence.series(k) or [0.0]) for k in ("groups/frac_all_wrong", "groups/frac_all_correct")
    )
    rewards = evidence.series("reward")
    group_size = evidence.group_size
    skip = evidence.setting("trainer.zero_variance_groups") == "skip"
    seen = f"{_rate(flat, total)} groups over {len(shares)} steps had no reward spread"
    if flat == total:
        seen += " (not one group with a spread" + (
            ": with trainer.zero_variance_groups=skip, not a single update)" if skip else ")"
        )
    tries = [f"trainer.num_generations={max(group_size * 2, 8)}   # larger groups: more chances of a spread"]
    misread = labels_misread(evidence)
    idle = no_tool_use(evidence)
    if all_wrong >= 0.5:
        paid = statistics.fmean(rewards) if rewards else 0.0
        if rewards and max(rewards) - min(rewards) < 1e-6 and paid > 0:
            seen += f"; every completion was wrong and paid the same {paid:.3g}: the reward cannot rank them"
        elif idle is not None:  # not too hard: never tried (the task's own advice would miss it)
            seen += f"; {all_wrong:.0%} of the groups were all wrong, and {idle.seen} (no_tool_use)"
            return Finding("no_signal", seen, NO_SIGNAL_WHY, (idle.tries[0], *tries))
        elif misread is not None:
            seen += (
                f"; {all_wrong:.0%} of the groups were all wrong by labels that misread the answers (labels_misread)"
            )
            tries = [misread.tries[0], *tries]
        else:
            seen += f"; {all_wrong:.0%} of the groups were all wrong: the task is too hard for the policy"
        # the misread labels first; else an easier start before larger groups, which rarely find a first right one
        tries = (
            [*tries[:1], *easier_settings(evidence), *tries[1:]] if misread else [*easier_settings(evidence), *tries]
        )
        warm_up = warmup_advice(evidence) if evidence.setting("rollout.environment") and not misread else None
        tries = [warm_up, *tries] if warm_up else tries  # a game never won: a player's episodes first
    elif all_right >= 0.5:
        seen += f"; {all_right:.0%} of the groups were all right: the task is too easy"
        tries += ["curriculum.enabled=true   # draw the prompts whose pass rate is between 0.1 and 0.9"]
        if evidence.setting("dataset.source") == "reasoning_gym":
            tries.append("dataset.levels.enabled=true   # harder levels once mastered")
    else:
        seen += "; the rewards were equal within groups whether right or wrong: the reward does not follow the labels"
        tries.append("grpo-exp probe <the run's overrides>   # what the reward pays, answer by answer")
    return Finding("no_signal", seen, NO_SIGNAL_WHY, tuple(tries))


NO_SIGNAL_WHY = (
    "GRPO learns only from differences within a group: a group whose completions all score alike has zero advantage "
    "and contributes nothing"
)


def easier_settings(evidence: RunEvidence) -> list[str]:
    """What makes a task the policy never gets right easier to start on."""
    tries = []
    if evidence.setting("dataset.source") == "reasoning_gym":
        tries.append("dataset.levels.enabled=true   # start at the task's easiest level and climb")
    if not evidence.setting("dataset.prompt.system"):
        tries.append('dataset.prompt.system="<a worked example: a question and its answer>"   # how to answer')
    return tries


def answer_collapse(evidence: RunEvidence, samples: list[dict] | None = None) -> Finding | None:
    """One answer given to most held-out problems (per task in a mix), its share of the answers above its share of
    the references (what it scores): the policy answers a constant, not the question. Reads the answers after
    training (or `samples`: a validation's). Not for environments, whose episodes have no reference answer."""
    if evidence.setting("rollout.environment"):  # an environment scores its episodes: there are no references
        return None
    samples = samples if samples is not None else evidence.after
    found = []
    tasks = sorted({s.get("task_name") for s in samples if s.get("task_name")}) or [None]
    for task in tasks:
        mine = [s for s in samples if task is None or s.get("task_name") == task]
        answers = [vote_key(s.get("answer")) for s in mine]
        given = [a for a in answers if a is not None]
        if len(mine) < 10 or not given:
            continue
        top, count = Counter(given).most_common(1)[0]
        references = [vote_key(str(s.get("solution"))) for s in mine if s.get("solution") is not None]
        bar = sum(r == top for r in references) / len(references) if references else 0.0
        low = wilson_interval(count, len(mine))[0]
        if len(set(references)) < 2 or not (low > COLLAPSE_SHARE and low > bar):
            continue
        where = f"{task}: " if task else ""
        found.append(
            f"{where}{_rate(count, len(mine))} held-out answers are {top!r}, which is the reference of {bar:.0%} "
            f"of them (what answering {top!r} to all scores)"
        )
    if not found:
        return None
    levels = evidence.setting("dataset.source") == "reasoning_gym" and not evidence.setting("dataset.levels.enabled")
    distinct = evidence.series("diversity/distinct_answers")
    trend = f"; distinct answers per group {distinct[0]:.2f} -> {distinct[-1]:.2f}" if len(distinct) > 1 else ""
    return Finding(
        "answer_collapse",
        "; ".join(found) + trend,
        "a constant answer earns the share of problems it happens to fit, and the training reward rises as if the "
        "policy learned; held-out accuracy stops at that share",
        # Measured on syllogism (experiments/README.md): trainer.beta=0.04 and trainer.num_generations=8 each collapsed
        # to the same constant, so neither is offered; what is left is to stop early and change what the policy can do.
        tuple(
            [
                "health.answer_collapse=stop   # end the run at the collapse (beta, larger groups did not stop it)",
                *(["dataset.levels.enabled=true   # a level where it can reason"] if levels else []),
                "model=pretrained model.name_or_path=<a larger policy>   # the constant was the best this one found",
            ]
        ),
    )


# ---- the held-out result ----------------------------------------------------------------------------------------


def paired_outcomes(evidence: RunEvidence, lenient: bool = False) -> tuple[list[float], list[float]]:
    """The held-out outcomes before and after, paired by problem (the same question in the same place; `lenient`:
    the content check instead of the labels)."""
    before, after = [], []
    for b, a in zip(evidence.before, evidence.after, strict=False):
        if b.get("question") != a.get("question"):
            continue
        if lenient:
            if b.get("solution") is None or b.get("correct") is None:
                continue
            pair = [float(bool(lenient_match(s.get("completion", ""), str(s["solution"])))) for s in (b, a)]
        else:
            pair = [answer_outcome(b), answer_outcome(a)]
            if None in pair:
                continue
        before.append(pair[0])
        after.append(pair[1])
    return before, after


def _change(before: list[float], after: list[float]) -> str:
    change, low, high = paired_change(before, after)
    return (
        f"{statistics.fmean(before):.3f} -> {statistics.fmean(after):.3f} ({change:+.3f}, paired 95% "
        f"[{low:+.3f}, {high:+.3f}], {len(before)} problems)"
    )


def format_gain(evidence: RunEvidence) -> Finding | None:
    """The held-out gain is format, not content: the labels' accuracy rose beyond noise while the content check's
    (the reference anywhere in the final sentence) did not rise beyond noise. Not for environments: they score their
    episodes themselves, and a game has no reference for the content check to find."""
    if evidence.setting("rollout.environment"):
        return None
    strict = paired_outcomes(evidence)
    lenient = paired_outcomes(evidence, lenient=True)
    if len(strict[0]) < 10 or len(lenient[0]) < 10:
        return None
    change, low, _ = paired_change(*strict)
    content, content_low, content_high = paired_change(*lenient)
    if not (low > 0 and (content_low <= 0 or content < change / 2)):
        return None
    lost = "; the content check fell beyond noise: answers it knew are no longer stated" if content_high < 0 else ""
    return Finding(
        "format_gain",
        f"held-out accuracy {_change(*strict)} while the content check went {_change(*lenient)}{lost}",
        "the policy learned to state answers it already knew in the form the labels read, not to know more",
        (
            'dataset.prompt.template="{question} Reply with the answer only."   # ask for the form, train content',
            "verifier.answer=stated_in_sentence   # or a rule that reads the answers as the model states them",
        ),
    )


def no_change(evidence: RunEvidence, explained: bool = False) -> Finding | None:
    """No measurable held-out change: the paired interval of the change includes 0. Says how many problems would
    resolve a difference of the observed size; with a flat training reward too and nothing else found (`explained`:
    another finding accounts for the run), the learning was too slow to see."""
    before, after = paired_outcomes(evidence)
    if len(before) < 10:
        return None
    change, low, high = paired_change(before, after)
    if not (low <= 0 <= high) or (low == high == 0 and before != after):
        return None
    needed = problems_to_resolve(before, after)
    seen = f"held-out {_change(before, after)}: no change the held-out set can tell from noise"
    if needed is not None:
        seen += f"; a change of {change:+.3f} would need about {needed} problems (dataset.eval_size) to show"
    elif before == after:
        seen += "; every held-out answer was judged as before training"
    slope = reward_slope(evidence)
    tries = [f"dataset.eval_size={needed}" if needed else "trainer.max_steps=<more>   # a longer run"]
    why = "a result within noise is no result either way: it can neither show that the setting works nor that it fails"
    if not explained and slope is not None and slope[1] <= 0 <= slope[2]:
        seen += f"; the training reward was flat too ({slope[0]:+.4f} a step, 95% [{slope[1]:+.4f}, {slope[2]:+.4f}])"
        steps = int(evidence.setting("trainer.max_steps", len(evidence.steps)) or len(evidence.steps))
        tries = [learning_rate_advice(evidence, slower=False), f"trainer.max_steps={max(steps * 2, 1)}"] + tries[
            : bool(needed)
        ]
        why = "nothing else is wrong that the run can see: learning may be too slow to show in this many steps"
    return Finding("no_change", seen, why, tuple(tries))


def reward_slope(evidence: RunEvidence) -> tuple[float, float, float] | None:
    rewards = [(i, v) for i, v in enumerate(evidence.series("reward"))]
    if len(rewards) < 3:
        return None
    slope = slope_interval([float(i) for i, _ in rewards], [v for _, v in rewards])
    return None if math.isnan(slope[0]) else slope


# The learning rate known to train: the default, with which the default run learns (held-out 0.25 -> 0.41).
KNOWN_RATE = next(f.default for f in dataclasses.fields(TrainerSchema) if f.name == "learning_rate")


def learning_rate_advice(evidence: RunEvidence, slower: bool) -> str:
    """trainer.learning_rate to try, starting from a value known to work, never a small step from the one that
    failed: the default where the run's rate was on the wrong side of it (below it for a run too slow, above it for
    one too fast), else a third (slower) or three times (faster) the run's own."""
    rate = float(evidence.setting("trainer.learning_rate", KNOWN_RATE) or KNOWN_RATE)
    if (rate > KNOWN_RATE) if slower else (rate < KNOWN_RATE):
        ratio = rate / KNOWN_RATE if slower else KNOWN_RATE / rate
        side = "above" if slower else "below"
        why = f"the default, which trains; this run's {rate:g} is {ratio:,.0f}x {side} it"
        return f"trainer.learning_rate={KNOWN_RATE:g}   # {why}"
    return f"trainer.learning_rate={rate / 3 if slower else rate * 3:.2g}"


SHARPENED_ENTROPY = 0.5  # the last steps' entropy at most this share of the first steps'


def sharpened(evidence: RunEvidence) -> Finding | None:
    """The training reward rose beyond noise, but no higher than the untrained policy's own greedy held-out measure,
    while the entropy fell and the held-out measure did not rise: the samples grew greedier, and what they converge
    to is what greedy decoding already did. No new skill; the reward is not to blame."""
    slope = reward_slope(evidence)
    before, after = paired_outcomes(evidence)
    entropies = evidence.series("entropy")
    if slope is None or not slope[1] > 0 or len(before) < 10 or len(entropies) < 10:
        return None
    change, low, high = paired_change(before, after)
    first_entropy, last_entropy = statistics.fmean(entropies[:5]), statistics.fmean(entropies[-5:])
    rewards = evidence.series("reward")
    window = max(1, len(rewards) // 4)
    first, last = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
    greedy = statistics.fmean(before)
    greedy_high = wilson_interval(round(sum(before)), len(before))[1] if set(before) <= {0, 1} else greedy
    if low > 0 or last > greedy_high or last_entropy > SHARPENED_ENTROPY * first_entropy:
        return None
    return Finding(
        "sharpened",
        f"the training reward rose {first:.3f} -> {last:.3f} ({slope[0]:+.4f} a step, 95% [{slope[1]:+.4f}, "
        f"{slope[2]:+.4f}]), up to no more than the untrained policy's greedy held-out {greedy:.3f}, while the "
        f"entropy fell {first_entropy:.2f} -> {last_entropy:.2f} nats a token and held-out went "
        f"{_change(before, after)}",
        "the sampled completions grew greedier: their reward rises towards what greedy decoding already scored, and "
        "the greedy policy itself learned nothing new",
        (
            "trainer.beta=0.04   # the KL to the start keeps the sampling spread",
            "trainer.num_generations=8   # more draws a group: better than greedy play gets found and paid",
            "trainer.temperature=1.2",
        ),
    )


def reward_not_truth(evidence: RunEvidence) -> Finding | None:
    """The training reward rose beyond noise while the held-out measure (accuracy, or episodes won) did not rise:
    suspect the reward. With the reward probe's findings where it ran. Not where the samples only grew greedier
    (sharpened)."""
    if sharpened(evidence) is not None:
        return None
    slope = reward_slope(evidence)
    before, after = paired_outcomes(evidence)
    if slope is None or not slope[1] > 0 or len(before) < 10:
        return None
    change, low, high = paired_change(before, after)
    if not (high <= 0 or (low <= 0 and change <= 0)):
        return None
    rewards = evidence.series("reward")
    window = max(1, len(rewards) // 4)
    first, last = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
    seen = (
        f"the training reward rose {first:.3f} -> {last:.3f} ({slope[0]:+.4f} a step, 95% [{slope[1]:+.4f}, "
        f"{slope[2]:+.4f}]) while held-out went {_change(before, after)}"
    )
    tries = []
    if evidence.probe:
        seen += "; the reward probe found: " + "; ".join(evidence.probe[:3])
    else:
        tries.append("probe.before_training=warn   # what the reward pays for without the answer")
    if not evidence.setting("eval.every"):
        tries.append("eval.every=10   # the reward-hacking alarm watches the two part ways")
    else:
        tries.append("eval.alarm=stop   # end the run when they part; checkpoint-best keeps the best validation")
    episodes = any(s.get("environment") is not None for s in evidence.before + evidence.after)
    if episodes and evidence.setting("reward.components.environment.pays", "reward") != "success":
        tries.append("reward.components.environment.pays=success   # a won episode only, not partial credit")
    return Finding(
        "reward_not_truth",
        seen,
        "the policy is paid for something other than what the held-out measure counts: a reward to fix, not a run "
        "to continue",
        tuple(tries),
    )


def heldout_fell(evidence: RunEvidence) -> Finding | None:
    """The held-out measure (accuracy, or episodes won) fell beyond noise while the training reward did not rise
    beyond noise (where it rose, reward_not_truth says so): training made the policy worse where it is measured."""
    before, after = paired_outcomes(evidence)
    slope = reward_slope(evidence)
    if len(before) < 10 or (slope is not None and slope[1] > 0):
        return None
    if not paired_change(before, after)[2] < 0:
        return None
    tries = [learning_rate_advice(evidence, slower=True)]
    if not evidence.setting("eval.every"):
        tries.insert(
            0, "eval.every=5   # validations; checkpoint-best keeps the best model, never worse than the start"
        )
    return Finding(
        "heldout_fell",
        f"held-out went {_change(before, after)} while the training reward did not rise beyond noise",
        "the updates made the policy worse on problems it was not trained on: its last model is not the one to keep",
        tuple(tries),
    )


# ---- the policy's health -----------------------------------------------------------------------------------------


def truncated(evidence: RunEvidence) -> Finding | None:
    """Completions cut at the length limit (the truncation warning's rule over the run's logged steps). A multi-turn
    run is read from its own rollout/cut_frac (last turns cut at rollout.max_tokens_per_turn): TRL's clipped ratio
    counts every trajectory that ends on a tool call or a game's move, which has no EOS, as cut."""
    turns = evidence.series(TURN_CUT)
    limit = MAX_TURN if turns else MAX_COMPLETION
    shares = turns or evidence.series("completions/clipped_ratio")
    found = truncation_warning(shares, _completions_per_step(evidence), 5, 0.5, limit)
    if found is None:
        return None
    length = evidence.setting(limit)
    return Finding(
        "truncated",
        found.split(": their answers")[0],
        "a cut completion never reaches its answer, so the reward scores unfinished text",
        (f"{limit}={int(length) * 2}" if length else f"{limit}=<more>",),
    )


def entropy(evidence: RunEvidence) -> Finding | None:
    found = entropy_alarm(evidence.series("entropy"), 5, 0.2, 3.0)
    if found is None:
        return None
    collapsed = "collapsed" in found
    return Finding(
        "entropy",
        found,
        "a collapsed policy samples the same completion in every group (no spread, nothing to learn); a blown-up one "
        "writes noise",
        ("trainer.beta=0.04", learning_rate_advice(evidence, slower=True))
        + (("trainer.temperature=1.2",) if collapsed else ()),
    )


def gradient_spikes(evidence: RunEvidence) -> Finding | None:
    """Gradient norms spiking: a logged step's norm above 10 times the run's median."""
    norms = evidence.series("grad_norm")
    if len(norms) < 5:
        return None
    median = statistics.median(norms)
    spikes = [n for n in norms if median > 0 and n > 10 * median]
    if not spikes:
        return None
    return Finding(
        "gradient_spikes",
        f"{len(spikes)} of {len(norms)} steps had a gradient norm above 10x the median {median:.3g} (largest "
        f"{max(spikes):.3g})",
        "a spike moves the policy far in one step; clipping bounds it, but frequent spikes mean unstable training",
        (learning_rate_advice(evidence, slower=True), "trainer.max_grad_norm=0.5"),
    )


MISMATCH_LOGP = 0.02  # mean |log p sampler - log p trainer| a token: float32 paths measure ~1e-5, bfloat16 ~0.04


def sampler_mismatch(evidence: RunEvidence) -> Finding | None:
    """The sampler's log-probabilities far from the trainer's (trainer.mismatch_metrics' measurement), so that PPO's
    ratio carries the difference: the mean over the steps of each step's mean above MISMATCH_LOGP."""
    differences = evidence.series("sampling/sampling_logp_difference/mean")
    if len(differences) < 3 or not statistics.fmean(differences) > MISMATCH_LOGP:
        return None
    low, high = (
        evidence.series("sampling/importance_sampling_ratio/min"),
        evidence.series("sampling/importance_sampling_ratio/max"),
    )
    span = f"; per-token ratio {statistics.fmean(low):.2f} to {statistics.fmean(high):.2f}" if low and high else ""
    epsilon = float(evidence.setting("trainer.epsilon", 0.2) or 0.2)
    return Finding(
        "sampler_mismatch",
        f"the sampler's log-probabilities are {statistics.fmean(differences):.3f} a token from the trainer's on "
        f"average over {len(differences)} steps{span} (PPO clips at 1 +- {epsilon:g})",
        "tokens are clipped or reweighted for the sampler's rounding, not for what the policy learned",
        (
            "generation=transformers_fast   # sample from the policy's own float32 weights",
            "trainer.mismatch_correction=behaviour_ratio",
        ),
    )


ESS_COLLAPSED = 0.5  # the importance weights' effective sample size, a share of the batch: the update rests on half


def importance_weights_collapsed(evidence: RunEvidence) -> Finding | None:
    """Batches sampled far from the policy that trains on them (generation ahead, a bfloat16 sampler): the importance
    weights' effective sample size (sampling/importance_sampling_ess_fraction) below ESS_COLLAPSED of the batch on
    average over the last half of the steps (at least 3 logged)."""
    ess = evidence.series("sampling/importance_sampling_ess_fraction")
    recent = ess[len(ess) // 2 :]
    if len(ess) < 3 or statistics.fmean(recent) >= ESS_COLLAPSED:
        return None
    clipped = evidence.series("sampling/importance_sampling_clipped_fraction")
    clip = f"; {statistics.fmean(clipped[len(clipped) // 2 :]):.0%} truncated or masked" if clipped else ""
    tries = []
    staleness = evidence.setting("trainer.max_staleness")
    if isinstance(staleness, int) and staleness > 0:
        tries.append(f"trainer.max_staleness={staleness - 1}   # each batch a step nearer the policy it trains")
    tries.append(learning_rate_advice(evidence, slower=True) + "   # the policy moves less between sampling and use")
    return Finding(
        "importance_weights_collapsed",
        f"the importance weights' effective sample size was {statistics.fmean(recent):.2f} of the batch on average "
        f"over the last {len(recent)} of {len(ess)} steps (lowest {min(ess):.2f}){clip}",
        "the batches were sampled far from the policy that trains on them: the update rests on a few completions, "
        "and the correction clamps or drops the rest",
        tuple(tries),
    )


# ---- multi-turn rollouts and environments ------------------------------------------------------------------------

USED_TOOL = "rollout/used_tool_frac"  # grpo_exp.rollout.flow.trajectory_statistics


def no_tool_use(evidence: RunEvidence) -> Finding | None:
    """A multi-turn run whose policy never called a tool (in an environment: never made a move) in any logged step:
    nothing it could learn to do better with them was ever sampled."""
    used = evidence.series(USED_TOOL)
    if len(used) < 3 or max(used) > 0:
        return None
    acting = "made a move" if evidence.setting("rollout.environment") else "called a tool"
    demo = (
        "the textarena_guess preset has one" if evidence.setting("rollout.environment") else "the calculator's has one"
    )
    warm_up = warmup_advice(evidence)
    return Finding(
        "no_tool_use",
        f"the policy never {acting}: {USED_TOOL} was 0 in all {len(used)} logged steps",
        "GRPO reinforces what the policy samples: a call never made earns nothing, so there is nothing to learn from",
        (
            f"rollout.demo=[...]   # a worked exchange before the task, a user turn and an assistant turn that "
            f"calls the tool ({demo})",
            *([warm_up] if warm_up else []),
            "rollout.system='...'   # the tool and how to call it, in words",
        ),
    )


EXPERTS = {"textarena/GuessTheNumber-v0": "grpo_exp.environments.textarena:guess_the_number_expert"}


def warmup_advice(evidence: RunEvidence) -> str | None:
    """A multi-turn run without a warm-up: train on an expert's episodes first (warmup=sft), the environment's own
    expert where grpo_exp has one. None where the run had a warm-up, or is single-turn."""
    if evidence.setting("warmup.source") not in (None, "none") or evidence.setting("rollout.name") == "single":
        return None
    expert = EXPERTS.get(str(evidence.setting("rollout.environment")), "<module:function that plays>")
    return (
        f"warmup=sft warmup.source=expert warmup.expert={expert}   # imitate a player's episodes before GRPO "
        "(docs/warmup.md)"
    )


def turns_exhausted(evidence: RunEvidence) -> Finding | None:
    """Tool-using trajectories that run out of turns: in the last quarter of the steps, on average at least 90% of
    rollout.max_turns turns, and under half of them end with a final answer (a game's episode is over when it is
    over: environments are left out)."""
    limit = evidence.setting("rollout.max_turns")
    turns, answered = evidence.series("rollout/turns_mean"), evidence.series("rollout/final_answer_frac")
    if evidence.setting("rollout.environment") or not limit or len(turns) < 4 or len(answered) < 4:
        return None
    tail = max(len(turns) // 4, 1)
    mean_turns, mean_answered = statistics.mean(turns[-tail:]), statistics.mean(answered[-tail:])
    if mean_turns < 0.9 * limit or mean_answered >= 0.5:
        return None
    return Finding(
        "turns_exhausted",
        f"trajectories ran out of turns: {mean_turns:.1f} of rollout.max_turns={limit} on average in the last steps, "
        f"and {mean_answered:.0%} ended with a final answer",
        "a trajectory still calling tools at its last turn has no answer for the reward to score",
        (
            f"rollout.max_turns={int(limit) * 2}",
            "rollout.system='...'   # ask for the answer once the tool has given it",
        ),
    )


def _completions_per_step(evidence: RunEvidence) -> int:
    return evidence.prompts_per_step * evidence.group_size


RULES = (
    labels_misread,
    no_signal,
    answer_collapse,
    format_gain,
    sharpened,
    reward_not_truth,
    heldout_fell,
    truncated,
    entropy,
    gradient_spikes,
    sampler_mismatch,
    importance_weights_collapsed,
    no_tool_use,
    turns_exhausted,
)
# What accounts for a held-out result by itself: with one of these found, no_change adds nothing.
EXPLAINS_HELDOUT = {
    "labels_misread",
    "no_signal",
    "answer_collapse",
    "format_gain",
    "sharpened",
    "reward_not_truth",
    "heldout_fell",
    "no_tool_use",
    "turns_exhausted",
}
