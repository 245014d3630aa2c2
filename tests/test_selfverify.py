"""Self-verification: post-processing as pure functions (property tests), verdicts and rewards, metrics,
P(Yes) against a hand-computed softmax, and end-to-end tiny-model runs of each schedule."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from grpo_exp.models import load_tokenizer
from grpo_exp.run.tracking import read_metrics
from grpo_exp.schema import ShownPart
from grpo_exp.text import tokens_covering
from grpo_exp.verification.labels import built_in_labels
from grpo_exp.verification.p_yes import p_yes_from_logits, question_messages, yes_no_token_ids
from grpo_exp.verification.selfverify import (
    NO,
    YES,
    Candidate,
    auroc,
    balanced_set,
    brier,
    expected_calibration_error,
    filter_candidates,
    judgement_metrics,
    matched_pairs,
    parse_judgement,
    select_samples,
    verdict_span,
    verification_prompt,
    verification_reward,
)
from grpo_exp.verification.task import Ranks, SelfVerificationTask
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli
from tests.helpers.tiny_trainer import G, Recording, generation_batch, make_trainer

candidate_lists = st.lists(
    st.builds(
        Candidate,
        problem=st.integers(0, 6),
        question=st.just("q"),
        response=st.text(max_size=5),
        answer=st.one_of(st.none(), st.sampled_from(["1", "2", "3"])),
        correct=st.booleans(),
        pass_rate=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    ),
    max_size=40,
)


@given(candidate_lists, st.integers(1, 12), st.integers(1, 4), st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_selection_properties(candidates, n, per_problem, seed):
    kept, removed = filter_candidates(candidates)
    assert sum(removed.values()) + len(kept) == len(candidates)
    chosen = select_samples(kept, n, 0.5, per_problem, seed)
    # nothing selected that a filter removed
    assert all(c.answer is not None and c.pass_rate > 0 for c in chosen)
    assert all(c in kept for c in chosen)
    # per-problem cap, size
    assert len(chosen) <= n
    assert all(sum(c.problem == p for c in chosen) <= per_problem for p in {c.problem for c in chosen})
    # same seed, same selection
    assert select_samples(kept, n, 0.5, per_problem, seed) == chosen


@given(candidate_lists, st.integers(1, 12), st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_balance_holds_exactly_when_possible(candidates, n, seed):
    yes = [c for c in candidates if c.correct]
    no = [c for c in candidates if not c.correct]
    chosen = select_samples(candidates, n, 0.5, per_problem=len(candidates) + 1, seed=seed)
    if len(yes) >= math.ceil(n / 2) and len(no) >= math.ceil(n / 2):
        assert sum(c.correct for c in chosen) in (n // 2, math.ceil(n / 2))  # exact for even n
        assert len(chosen) == n
    else:  # a short pool is made up from the other, as far as there are candidates
        assert len(chosen) == min(n, len(candidates))


@given(candidate_lists, st.integers(1, 5), st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_matched_pairs_are_exactly_balanced_and_pair_answers_to_one_problem(candidates, pairs, seed):
    chosen = matched_pairs(candidates, pairs, seed)
    mixed = {c.problem for c in candidates if c.correct} & {c.problem for c in candidates if not c.correct}
    assert len(chosen) == 2 * min(pairs, len(mixed))  # as many as the buffer allows, never a lone label
    for right, wrong in zip(chosen[::2], chosen[1::2], strict=True):
        assert right.correct and not wrong.correct and right.problem == wrong.problem
        assert right in candidates and wrong in candidates
    assert len({c.problem for c in chosen}) == len(chosen) // 2  # a problem gives one pair at most
    assert matched_pairs(candidates, pairs, seed) == chosen


def test_a_pair_prefers_a_wrong_answer_that_differs_from_the_right_one():
    right = Candidate(0, "q", "r", "5", True, 0.5)
    same_text = Candidate(0, "q", "s", "5", False, 0.5)  # labelled wrong with the same answer (e.g. a bad format)
    other = Candidate(0, "q", "t", "6", False, 0.5)
    assert all(matched_pairs([right, same_text, other], 1, seed) == [right, other] for seed in range(10))


@given(candidate_lists, st.integers(1, 10), st.integers(1, 3), st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_the_benchmark_set_is_exactly_balanced_within_its_caps(candidates, per_label, per_problem, seed):
    chosen = balanced_set(candidates, per_label, per_problem, seed)
    yes = sum(c.correct for c in chosen)
    assert yes == len(chosen) - yes <= per_label
    assert all(sum(c.problem == p for c in chosen) <= per_problem for p in {c.problem for c in chosen})
    assert balanced_set(candidates, per_label, per_problem, seed) == chosen


def test_one_example_per_step_alternates_between_labels_over_seeds():
    pools = [Candidate(0, "q", "a", "1", True, 0.5), Candidate(0, "q", "b", "2", False, 0.5)]
    labels = [select_samples(pools, 1, 0.5, 2, seed)[0].correct for seed in range(200)]
    assert 70 < sum(labels) < 130  # about half "Yes", not always the same label


def test_selection_spreads_over_problems_and_prefers_distinct_answers():
    make = lambda p, a, ok: Candidate(p, "q", a, a, ok, 0.5)  # noqa: E731
    candidates = [make(0, "1", True), make(0, "1", True), make(0, "2", True), make(1, "3", True), make(2, "4", True)]
    chosen = select_samples(candidates, 3, yes_share=1.0, per_problem=2, seed=0)
    assert {c.problem for c in chosen} == {0, 1, 2}  # one per problem before a second from any
    two = select_samples(candidates[:3], 2, yes_share=1.0, per_problem=2, seed=0)
    assert {c.answer for c in two} == {"1", "2"}  # distinct answers first


def test_filters_count_what_they_remove():
    no_answer, all_wrong = Candidate(0, "q", "r", None, False, 0.5), Candidate(1, "q", "r", "1", False, 0.0)
    kept, removed = filter_candidates([no_answer, all_wrong, Candidate(2, "q", "r", "1", True, 1.0)])
    assert removed == {"no_answer": 1, "all_wrong": 1} and [c.problem for c in kept] == [2]
    assert filter_candidates([Candidate(1, "q", "r", None, False, 0.0)], False, False)[1] == {
        "no_answer": 0,
        "all_wrong": 0,
    }


def test_verdicts_and_rewards():
    assert parse_judgement("Looks right. \\boxed{Yes}") == YES
    assert parse_judgement("\\boxed{no.}") == NO
    assert parse_judgement("Yes") is None and parse_judgement("\\boxed{maybe}") is None
    assert parse_judgement("Yes, it is right.", strict=False) == YES
    assert parse_judgement("Noticeably, no.", strict=False) == NO and parse_judgement("unsure", strict=False) is None
    assert verification_reward(YES, YES, 0.8, False) == 1.0
    assert verification_reward(YES, YES, 0.25, True) == 0.25 and verification_reward(YES, YES, 0.8, True) == 0.5
    assert verification_reward(NO, YES, 1.0, False) == 0.0 and verification_reward(None, NO, 1.0, False) == 0.0
    c = Candidate(0, "What is 2+2?", "2+2 is \\boxed{4}", "4", True, 1.0)
    assert verification_prompt(c, "Q: {question} A: {answer}")[0]["content"] == "Q: What is 2+2? A: 4"
    assert verification_prompt(c, "A: {answer}", show=ShownPart.solution)[0]["content"] == "A: 2+2 is \\boxed{4}"


def test_the_verdict_span_ends_where_the_verdict_was_read():
    assert verdict_span("No, because 3 x 5 is 15.", strict=False) == (NO, 2)
    boxed = "It checks out: \\boxed{Yes}. No more."
    end = boxed.index(".")  # just after the box's closing brace; the later "No" is not the verdict
    assert verdict_span(boxed) == (YES, end) and verdict_span(boxed, strict=False) == (YES, end)
    assert verdict_span("\\boxed{maybe} yes", strict=False) == (None, None)  # a malformed box is not read past
    assert verdict_span("Yes") == (None, None) and verdict_span("unsure", strict=False) == (None, None)


def test_tokens_covering_counts_the_tokens_that_wrote_a_prefix_even_through_a_split_character():
    cfg = compose_config(["model=tiny"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    text = "Hmm 😀😀 No, wrong."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert decode(ids) == text
    end = text.index(",")
    count = tokens_covering(ids, text, end, decode)
    assert decode(ids[:count]) == text[:end]
    assert len(decode(ids[: count - 1])) < end or decode(ids[: count - 1])[:end] != text[:end]
    assert tokens_covering(ids, text, len(text), decode) == len(ids)


def selfverify_task(*overrides: str) -> SelfVerificationTask:
    cfg = compose_config(["reward=selfverify+length", *overrides]).reward.components.selfverify
    return SelfVerificationTask(cfg, verifier=built_in_labels(), p_yes=None, seed=0)


def test_loss_on_verdict_counts_a_verification_completion_up_to_its_verdict_only():
    cfg = compose_config(["model=tiny"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    texts = ["No, the answer is 16 not 15.", "I think \\boxed{Yes} since 2+2=4", "Unsure, maybe.", "Yes: 4"]
    encoded = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, encoded))
    ids = torch.tensor([e + [tokenizer.pad_token_id] * (width - len(e)) for e in encoded])
    completion_mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoded])
    rows = [{"task": "verify"}] * 3 + [{"task": "generate"}]

    mask = selfverify_task("reward.components.selfverify.strict_verdict=false").verdict_loss_mask(
        rows, ids, completion_mask, decode
    )
    counted = [ids[i][(completion_mask[i] * mask[i]).bool()].tolist() for i in range(4)]
    assert decode(counted[0]) == "No" and decode(counted[1]) == "I think \\boxed{Yes}"
    assert counted[2] == encoded[2] and counted[3] == encoded[3]  # no verdict: all of it; an answer: untouched
    strict = selfverify_task().verdict_loss_mask(rows, ids, completion_mask, decode)
    assert (strict[0] == 1).all() and decode(ids[1][(completion_mask[1] * strict[1]).bool()].tolist()).endswith("}")
    whole = selfverify_task("reward.components.selfverify.loss_on=completion")
    assert whole.verdict_loss_mask(rows, ids, completion_mask, decode) is None


class FirstThreeTokens(Recording):
    """A loss_token_mask hook that counts the first three generated tokens of every completion."""

    def loss_token_mask(self, rows, completion_ids, completion_mask):
        mask = torch.zeros_like(completion_mask)
        mask[:, :3] = 1
        return mask


def by_member(completions, **kwargs):
    return [float(i % G) for i in range(len(completions))]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_the_seam_applies_the_loss_token_mask_and_recounts_trls_tokens(tmp_path, loss_type):
    trainer = make_trainer(
        tmp_path, by_member, prompts=2, trainer_class=FirstThreeTokens, overrides=[f"trainer.loss_type={loss_type}"]
    )
    batch = generation_batch(trainer, prompts=2)
    lengths = batch["completion_mask"].sum(dim=1)
    assert (lengths <= 3).all() and (lengths > 0).all()
    assert int(batch["num_items_in_batch"]) == int(lengths.sum())  # dapo's normaliser counts what the loss counts
    assert max(b.lengths.max().item() for b in trainer.batches) > 3  # statistics still see every generated token

    def gradient(inputs):
        trainer.model.zero_grad(set_to_none=True)
        trainer.compute_loss(trainer.model, inputs).backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters()])

    changed = batch["completion_ids"].clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % trainer.model.config.vocab_size
    cut = gradient(batch)
    assert cut.abs().max() > 0
    torch.testing.assert_close(gradient({**batch, "completion_ids": changed}), cut)


def test_judgement_and_probability_metrics_hand_computed():
    stats = judgement_metrics([True, True, False, None], [True, False, False, True], "v")
    assert stats["v/accuracy"] == 0.5 and stats["v/precision_yes"] == 0.5 and stats["v/recall_yes"] == 0.5
    assert stats["v/f1_yes"] == 0.5 and stats["v/malformed"] == 0.25
    assert auroc([0.9, 0.8, 0.3, 0.1], [True, False, True, False]) == 0.75
    assert auroc([0.5, 0.5], [True, False]) == 0.5 and math.isnan(auroc([0.5], [True]))
    assert brier([1.0, 0.0, 0.5], [True, True, False]) == pytest.approx((0 + 1 + 0.25) / 3)
    # bins: [0.9, 0.95] -> confidence 0.925, accuracy 0.5; [0.15] -> confidence 0.15, accuracy 0
    assert expected_calibration_error([0.9, 0.95, 0.15], [True, False, False]) == pytest.approx(
        2 / 3 * abs(0.925 - 0.5) + 1 / 3 * 0.15
    )


def test_p_yes_matches_a_hand_computed_softmax_on_a_tiny_model(tiny_model_dirs):
    cfg = compose_config(["model=tiny"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs(seed=3)).eval()
    yes, no = yes_no_token_ids(tokenizer, "Yes", "No")
    conversations = [
        question_messages("{question} {answer} Correct?", q, a)
        for q, a in [("1+1?", "2"), ("longer question here", "7")]
    ]
    scores = p_yes_from_logits(model, tokenizer, conversations, yes, no, batch_size=2)  # batched, left-padded
    for conversation, score in zip(conversations, scores, strict=True):
        ids = tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            logits = model(**ids).logits[0, -1]
        expected = math.exp(logits[yes]) / (math.exp(logits[yes]) + math.exp(logits[no]))
        assert score == pytest.approx(expected, abs=1e-5)


SELFVERIFY_TINY = [
    "reward=selfverify+length",  # length gives the random tiny model's verdicts a reward spread
    "reward.components.selfverify.drop_no_answer=false",  # the tiny model never writes an answer
    "reward.components.selfverify.drop_all_wrong=false",
    "reward.components.selfverify.balance=share",  # the tiny model is never right: no matched pair exists
    "stats.table_every=1",
    "stats.table_groups=8",
    "trainer.max_steps=3",
    "logger=none",
    "eval.before=false",
    "eval.after=false",
]


SCHEDULES = {"joint": [2, 3], "interleave": [2], "verify_only": [1, 2, 3]}  # each one's verification steps


@pytest.fixture(scope="module")
def schedule_runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny run of each schedule: joint and verify_only in one multirun; interleave on its own, with its own
    setting (selfverify.every=2), which the other schedules would refuse as one they ignore."""
    sweep, interleave = tmp_path_factory.mktemp("schedules"), tmp_path_factory.mktemp("interleave")
    schedule = "reward.components.selfverify.schedule"
    result = run_cli("-m", *TINY_RUN, *SELFVERIFY_TINY, f"{schedule}=joint,verify_only", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    every = "reward.components.selfverify.every=2"
    result = run_cli(*TINY_RUN, *SELFVERIFY_TINY, f"{schedule}=interleave", every, f"hydra.run.dir={interleave}")
    assert result.returncode == 0, result.stderr[-3000:]
    return {"joint": sweep / "0", "verify_only": sweep / "1", "interleave": interleave}


@pytest.mark.e2e
@pytest.mark.parametrize(("schedule", "verification_steps"), SCHEDULES.items())
def test_each_schedule_trains_on_verification_prompts(schedule, verification_steps, schedule_runs):
    run_dir = schedule_runs[schedule]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["reward"]["components"]["selfverify"]["schedule"] == schedule
    steps = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl") if "grad_norm" in m}
    assert [s for s, m in steps.items() if (m.get("selfverify/groups") or 0) > 0] == verification_steps
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    verify = [s for s in samples if s["task"] == "verify"]
    assert sorted({s["step"] for s in verify}) == verification_steps
    assert all("Is the student's answer correct?" in s["prompt"] and s["reward/selfverify"] is not None for s in verify)
    # TRL's update used them: verification completions carry non-zero advantages, and the weights moved.
    assert any(s["advantage"] not in (0.0, None) for s in verify)
    assert all(steps[s]["grad_norm"] > 0 for s in verification_steps)


def test_confidence_needs_a_generative_verifier():
    from grpo_exp.errors import UserError  # printed as one message, no traceback (tests/test_cli.py)
    from grpo_exp.run.resolve import resolve

    with pytest.raises(UserError, match="scorer=genrm"):
        resolve(compose_config([*TINY_RUN, "reward=math+confidence", "logger=none"]))


@pytest.mark.e2e
def test_confidence_reward_from_a_frozen_genrm_trains_end_to_end(confidence_run):
    """tests/conftest.py's confidence_run: reward=math+confidence (the random tiny model is never right: its
    updates come from the confidence component's spread)."""
    steps = [m for m in read_metrics(confidence_run.run_dir / "metrics.jsonl") if "rewards/confidence/mean" in m]
    assert len(steps) == 2 and all(0 < m["rewards/confidence/mean"] < 1 for m in steps)
    assert any(m["grad_norm"] > 0 for m in steps)


def test_candidates_from_groups():
    from grpo_exp.text import stated_answer
    from grpo_exp.verification.selfverify import candidates_from_groups

    found = candidates_from_groups(
        ["q0", "q1"], ["\\boxed{1}", "2", "x", "y"], [True, False, None, None], 2, stated_answer, first_problem=10
    )
    assert [(c.problem, c.answer, c.correct, c.pass_rate) for c in found] == [
        (10, "1", True, 0.5),
        (10, "2", False, 0.5),
    ]


@pytest.mark.e2e
def test_the_supervised_verdict_objective_adds_its_loss_and_keeps_the_batch_for_answers(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        *TINY_RUN,
        *SELFVERIFY_TINY,
        "reward.components.selfverify.objective=supervised",
        "reward.components.selfverify.schedule=joint",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "grad_norm" in m]
    losses = [m.get("selfverify/verdict_loss") for m in steps]
    # step 1 has no candidates yet; then each step's examples (two Yes/No answers of a random model) are trained
    assert losses[0] is None and all(0.0 < loss < 5.0 for loss in losses[1:])
    assert all(m["grad_norm"] > 0 for m in steps[1:])
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["task"] == "generate" for s in samples)  # no verification prompt in the GRPO batch


def test_the_confidence_reward_asks_about_the_final_answer_and_gives_no_answer_zero():
    from grpo_exp.rewards.confidence import make_confidence_reward
    from grpo_exp.verification.labels import built_in_labels
    from grpo_exp.verification.p_yes import PYesScorer

    cfg = compose_config([*TINY_RUN, "scorer=genrm", "scorer.model=tiny"])
    scorer = PYesScorer(cfg.scorer, cfg.model, cfg.cache_dir)
    reward = make_confidence_reward(scorer, ShownPart.answer, built_in_labels())
    completions = [[{"role": "assistant", "content": "so it is \\boxed{5}"}], [{"role": "assistant", "content": "?"}]]
    prompts = [[{"role": "user", "content": "Calculate 2 + 3. Box it."}]] * 2
    scores = reward(prompts, completions, question=["Calculate 2 + 3.", "Calculate 2 + 3."])
    assert scores[1] == 0.0 and scores[0] == pytest.approx(scorer(["Calculate 2 + 3."], ["5"])[0])
    whole = make_confidence_reward(scorer, ShownPart.solution, built_in_labels())(
        prompts, completions, question=["q", "q"]
    )
    assert whole[0] == pytest.approx(scorer(["Calculate 2 + 3. Box it."], ["so it is \\boxed{5}"])[0])


def test_a_run_directory_names_the_model_it_trained(tmp_path):
    from grpo_exp.models import model_option_config

    (tmp_path / "checkpoint-final").mkdir()
    assert model_option_config(str(tmp_path), "scorer.model").name_or_path == str(tmp_path / "checkpoint-final")
    assert model_option_config("org/model", "scorer.model").name_or_path == "org/model"


def _filled_task(*overrides: str) -> SelfVerificationTask:
    """A task whose buffer holds 6 problems with mixed results (4 answers each: 2 right, 2 wrong)."""
    task = selfverify_task(*overrides)
    questions = [f"q{i}" for i in range(6)]
    texts = [f"\\boxed{{{i * 10 + j}}}" for i in range(6) for j in range(4)]
    task.observe(questions, texts, [j < 2 for _ in range(6) for j in range(4)], 4)
    return task


def _rows(groups: int, size: int) -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": f"p{g}"}], "question": f"p{g}", "solution": "1"}
        for g in range(groups)
        for _ in range(size)
    ]


@pytest.mark.parametrize("balance", ["pairs", "share"])
def test_the_processes_share_out_one_selection_for_the_whole_step(balance):
    """2 processes with 2 groups each choose the examples of a 4-group step once, and each takes every second one:
    together the one-process choice for 4 groups, no example twice, and each keeps a generation group."""
    overrides = [f"reward.components.selfverify.balance={balance}", "reward.components.selfverify.fraction=0.5"]
    whole, _ = _filled_task(*overrides).mix_in(_rows(4, 2), 2, 1, None)
    chosen = [r["prompt"][0]["content"] for r in whole[::2] if r["task"] == "verify"]
    assert len(chosen) == 2
    shares = [_filled_task(*overrides).mix_in(_rows(2, 2), 2, 1, None, Ranks(i, 2))[0] for i in range(2)]
    for rows in shares:
        assert [r["task"] for r in rows[::2]] == ["generate", "verify"], "one of its two groups verifies"
    dealt = [r["prompt"][0]["content"] for rows in shares for r in rows[::2] if r["task"] == "verify"]
    assert sorted(dealt) == sorted(chosen)


def test_supervised_examples_are_dealt_with_weights_that_average_to_the_steps_mean():
    overrides = ["reward.components.selfverify.objective=supervised", "reward.components.selfverify.pairs_per_step=2"]
    alone = _filled_task(*overrides)
    alone.mix_in(_rows(4, 2), 2, 1, None)
    assert len(alone.pending_verdict_examples) == 4 and alone.pending_verdict_weights == [0.25] * 4
    tasks = [_filled_task(*overrides) for _ in range(3)]
    for i, task in enumerate(tasks):  # 3 processes share out the 4 examples: 2, 1 and 1
        task.mix_in(_rows(2, 2), 2, 1, None, Ranks(i, 3))
    chosen = [c.response for c in alone.pending_verdict_examples]
    assert [[c.response for c in t.pending_verdict_examples] for t in tasks] == [chosen[i::3] for i in range(3)]
    # DDP averages the processes' gradients: sum over processes of (weight x loss) / 3 is the mean over 4
    assert [t.pending_verdict_weights for t in tasks] == [[0.75, 0.75], [0.75], [0.75]]


def test_the_held_out_measure_asks_the_runs_own_answering_for_answers_then_verdicts(tiny_policy):
    """heldout_metrics gets the policy's answers as the run gives them (`answers`: its vLLM engine, else the
    prepacked copy, else generate()): sampled answers to each problem, then greedy verdicts on a balanced set of
    them; only the P(Yes) is read from the policy's own forward."""
    from datasets import Dataset

    model, tokenizer = tiny_policy
    problems = [(f"What is {i} + 1?", str(i + 1)) for i in range(4)]
    dataset = Dataset.from_list(
        [{"question": q, "prompt": [{"role": "user", "content": q}], "solution": s} for q, s in problems]
    )
    asked = []

    def answers(prompts: list, temperature: float, desc: str | None) -> list[str]:
        asked.append((len(prompts), temperature, desc))
        if desc == "own answers":  # each problem's two answers: one right, one wrong
            return [f"\\boxed{{{int(s) + k}}}" for _, s in problems for k in (0, 1)]
        return ["\\boxed{Yes}"] * len(prompts)  # the verdicts: every answer called right

    metrics = selfverify_task().heldout_metrics(answers, model, tokenizer, dataset, batch_size=4, samples=2)
    examples = int(metrics["verify/examples"])
    assert asked == [(8, 1.0, "own answers"), (examples, 0.0, "verdicts")]
    assert examples == 4 and metrics["verify/yes_share"] == 0.5  # balanced: as many right answers as wrong
    assert metrics["verify/accuracy"] == 0.5 and 0.0 <= metrics["verify/p_yes/auroc"] <= 1.0
