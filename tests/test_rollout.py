"""Multi-turn rollouts with a tiny model that has been taught the tool protocol: the trajectories, their
masks, what TRL receives, and an end-to-end run in which TRL's GRPOTrainer updates the weights."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_exp.data import load_splits
from grpo_exp.models import load_tokenizer
from grpo_exp.rewards.math import make_math_reward
from grpo_exp.rollout.flow import group_advantages, turn_spans
from grpo_exp.rollout.multiturn import MultiTurnRollout, greedy_generation, scored_on_final_turn
from grpo_exp.run.tracking import read_metrics
from grpo_exp.run_files import latest_evaluation
from grpo_exp.trainer.config import grpo_exp_config
from grpo_exp.trainer.prepacked_linear import can_prepack
from grpo_exp.trainer.trainer import GRPOExpTrainer
from grpo_exp.trainer.trl_batch import RolloutFunc
from grpo_exp.verification.labels import built_in_labels
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import NO_SAVED_WEIGHTS, run_cli
from tests.helpers.episodes import write_user_module
from tests.helpers.tiny_trainer import PLAIN_TRL, knob_overrides

MULTITURN = [
    *TINY_RUN,
    "rollout=multiturn",
    "rollout.tools=[calculator]",
    "rollout.max_turns=3",
    "rollout.max_tokens_per_turn=24",
]
SAMPLING = {"do_sample": True, "temperature": 1.0, "top_p": None, "top_k": None}


def demonstration(row: dict) -> str:
    """What a tool-using answer to 'Calculate 88 + 94.' looks like, with the calculator's real result."""
    expression = row["question"].splitlines()[0].removeprefix("Calculate ").rstrip(".")
    return f"<calc>{expression}</calc>\n<result>{row['solution']}</result>\nThe answer is \\boxed{{{row['solution']}}}."


@pytest.fixture(scope="module")
def protocol_model(tmp_path_factory, tiny_model_dir):
    """The tiny random model, fine-tuned for a few seconds on demonstrations so that it calls the calculator
    (a random model never writes <calc>...</calc>); saved like any pretrained model."""
    cfg = compose_config(MULTITURN)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rollout = MultiTurnRollout(cfg.rollout)
    rows = list(load_splits(cfg.dataset)[0])[:48]
    examples = []
    for row in rows:
        prompt = tokenizer.apply_chat_template(
            rollout.messages(row["prompt"]), add_generation_prompt=True, return_dict=True
        )["input_ids"]
        answer = tokenizer(demonstration(row) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        examples.append((prompt, answer))
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(80):
        prompt, answer = examples[step % len(examples)]
        # the loss on the answer's tokens alone, as labels masking the prompt give it, from the logits of the
        # positions that predict them only (logits_to_keep): the LM head over every prompt position was most of it
        logits = model(input_ids=torch.tensor([prompt + answer]), logits_to_keep=len(answer) + 1).logits[0, :-1]
        torch.nn.functional.cross_entropy(logits, torch.tensor(answer)).backward()
        optimiser.step()
        optimiser.zero_grad()
    directory = tmp_path_factory.mktemp("protocol_model")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.e2e  # the protocol_model fixture fine-tunes for a minute on 2 cores
def test_trajectories_interleave_turns_and_masked_observations(protocol_model):
    cfg = compose_config(MULTITURN)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = AutoModelForCausalLM.from_pretrained(protocol_model)
    rollout = MultiTurnRollout(cfg.rollout)
    prompts = [row["prompt"] for row in list(load_splits(cfg.dataset)[1])] * 2
    torch.manual_seed(0)
    trajectories = rollout.run(model, tokenizer, prompts, SAMPLING | {"pad_token_id": tokenizer.pad_token_id}, 4)

    assert any(t.tool_calls for t in trajectories), "the taught model should call the calculator"
    for t in trajectories:
        assert len(t.env_mask) == len(t.completion_ids)
        # Only a final turn may end with EOS: a turn that stopped at a call carries no padding EOS.
        assert tokenizer.eos_token_id not in t.completion_ids[:-1]
        assert 1 <= len(t.turns) <= cfg.rollout.max_turns
        # The masked tokens are exactly the calculator's observations, in order.
        masked = [i for i, m in zip(t.completion_ids, t.env_mask, strict=True) if not m]
        assert masked == [i for o in t.observations for i in tokenizer(o, add_special_tokens=False)["input_ids"]]
        assert len(t.observations) == len(turn_spans(t.env_mask)) - 1
        assert len(turn_spans(t.env_mask)) == len(t.turns) or (not t.ended and len(t.turns) == cfg.rollout.max_turns)
        # Every turn but the last called a tool; the final turn holds the answer only when it called none.
        assert t.tool_calls >= len(t.turns) - 1
        assert t.final_turn == (t.turns[-1] if t.ended else "")

    greedy = greedy_generation(tokenizer)
    first, second = (rollout.run(model, tokenizer, prompts[:4], greedy, 4) for _ in range(2))
    assert [t.completion_ids for t in first] == [t.completion_ids for t in second]


def multiturn_trainer(protocol_model, directory, **knobs) -> GRPOExpTrainer:
    """GRPOExpTrainer on the protocol model with the calculator's multi-turn rollout, G=4, the math reward on the final
    turn; PLAIN_TRL's knobs but `knobs`."""
    cfg = compose_config(
        [
            *MULTITURN,
            "model=pretrained",
            f"model.name_or_path={protocol_model}",
            "trainer.num_generations=4",
            *knob_overrides(PLAIN_TRL | knobs),
        ]
    )
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    train_set, _ = load_splits(cfg.dataset)
    return GRPOExpTrainer(
        verifier=built_in_labels(),
        stats_cfg=cfg.stats,
        model=AutoModelForCausalLM.from_pretrained(protocol_model),
        reward_funcs=[scored_on_final_turn(make_math_reward(built_in_labels()))],
        args=grpo_exp_config(cfg.trainer, directory, "none", [1.0], False),
        train_dataset=train_set,
        processing_class=tokenizer,
        rollout_func=RolloutFunc(MultiTurnRollout(cfg.rollout)),
    )


@pytest.mark.e2e  # the protocol_model fixture fine-tunes for a minute on 2 cores
def test_trl_receives_the_mask_and_normalises_rewards_per_trajectory(protocol_model, tmp_path):
    trainer = multiturn_trainer(protocol_model, tmp_path / "trainer")
    tokenizer, train_set = trainer.processing_class, trainer.train_dataset
    inputs = [dict(train_set[i]) for i in range(2) for _ in range(4)]
    torch.manual_seed(0)
    output = trainer.generate_and_score(inputs)

    loss_mask = output["completion_mask"] * output["tool_mask"]
    assert (output["tool_mask"] == 0).any(), "some trajectory should hold an observation"
    for row, ids, mask, full in zip(
        inputs, output["completion_ids"], loss_mask, output["completion_mask"], strict=True
    ):
        kept = ids[mask.bool()].tolist()
        dropped = ids[(full - mask).bool()].tolist()
        # The loss sees the policy's turns only (the final turn among them), never a calculator's answer.
        assert tokenizer.decode(dropped).count("\n<result>") == row["tool_calls"] - (not row["ended"])
        assert row["final_turn"] in tokenizer.decode(kept, skip_special_tokens=True)
        assert len(turn_spans(mask[full.bool()].tolist())) == row["num_turns"]
    rewards = torch.tensor(trainer.last_rewards("math")).view(2, 4)
    assert torch.allclose(output["advantages"], group_advantages(rewards).flatten(), atol=1e-5)


@pytest.mark.e2e
def test_multiturn_training_end_to_end(protocol_model, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        *MULTITURN,
        "model=pretrained",
        f"model.name_or_path={protocol_model}",
        "model.dtype=float32",
        "reward=math+format",
        "trainer.num_generations=4",
        "trainer.beta=0.04",
        "trainer.learning_rate=1e-3",
        "stats.table_every=1",
        "logger=none",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]

    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 2
    assert any(m["rollout/tool_calls_mean"] > 0 for m in steps)
    assert all(
        k in steps[0] for k in ("rollout/turns_mean", "rollout/tool_errors_mean", "rollout/final_answer_frac", "kl")
    )
    assert any(k.startswith("rollout/reward_by_turns/") for k in steps[0])
    assert any(m["grad_norm"] > 0 for m in steps)
    trained = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoint-final").state_dict()
    initial = AutoModelForCausalLM.from_pretrained(protocol_model).state_dict()
    assert any(not torch.equal(p, initial[name]) for name, p in trained.items()), "GRPO did not change any weight"

    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(len(s["turn_advantages"]) == s["turns"] for s in samples)
    assert all(len(set(s["turn_advantages"])) == 1 for s in samples)  # one advantage for all of a trajectory's turns
    evaluated = [json.loads(line) for line in (run_dir / "eval_after.jsonl").read_text().splitlines()]
    assert all({"trajectory", "num_turns", "tool_calls", "final_turn"} <= set(e) for e in evaluated)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "heldout_rollout_turns_mean_after" in summary


@pytest.mark.e2e
def test_evaluate_plays_trajectories_with_the_tools(protocol_model):
    result = run_cli(
        str(protocol_model),
        "rollout=multiturn",
        "rollout.tools=[calculator]",
        "dataset.eval_size=4",
        "rollout.max_tokens_per_turn=24",
        "eval.samples=2",
        module="grpo_exp.evaluate",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(latest_evaluation(protocol_model).read_text())
    assert results["problems"] == 4 and "pass@2" in results
    assert results["greedy rollout/tool_calls_mean"] > 0


@pytest.mark.e2e  # the protocol_model fixture fine-tunes for a minute on 2 cores
@pytest.mark.skipif(not can_prepack(), reason="this CPU or torch build cannot prepack float32 weights (MKL or oneDNN)")
def test_turns_are_sampled_from_the_prepacked_copy_with_the_policys_log_probs(protocol_model, tmp_path):
    """trainer.fast_generation with rollout=multiturn: TRL's rollout_func samples the turns from the policy's prepacked
    float32 copy; the log-probabilities it records are the policy's own (a teacher-forced forward), within float
    rounding, so nothing needs correcting."""
    trainer = multiturn_trainer(protocol_model, tmp_path / "trainer", fast_generation=True, mismatch_metrics=True)
    prompts = [trainer.train_dataset[i]["prompt"] for i in range(2) for _ in range(4)]
    trainer.rollout_rows = [dict(trainer.train_dataset[i]) for i in range(2) for _ in range(4)]
    torch.manual_seed(0)
    batch = trainer.rollout_func(prompts, trainer)
    assert trainer.sampler.copy is not None and trainer.sampler.copy.prepacked
    assert any(0 in mask for mask in batch["env_mask"]), "some trajectory should call the calculator"
    policy = trainer.model
    for prompt, completion, mask, sampled in zip(
        batch["prompt_ids"], batch["completion_ids"], batch["env_mask"], batch["logprobs"], strict=True
    ):
        with torch.no_grad():
            logits = policy(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits / trainer.temperature, -1).gather(1, torch.tensor(completion)[:, None])
        policy_tokens = torch.tensor(mask, dtype=torch.bool)
        torch.testing.assert_close(
            torch.tensor(sampled)[policy_tokens], expected[:, 0][policy_tokens], atol=1e-4, rtol=0
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rollout.tools=[calculator,shell]"],
            r"unknown tool\(s\) \['shell'\]; the tools are \['calculator', 'python'\]",
        ),
        (["rollout.tools=[]"], "rollout.tools is empty"),
        (["reward=math+selfverify"], "selfverify with rollout=multiturn is not supported"),
        (["rollout.max_turns=0"], "rollout.max_turns and rollout.max_tokens_per_turn must be at least 1"),
    ],
)
def test_bad_multiturn_settings_are_refused_before_any_model_loads(overrides, message):
    from grpo_exp.errors import UserError
    from grpo_exp.run.resolve import resolve

    with pytest.raises(UserError, match=message):
        resolve(compose_config([*MULTITURN, *overrides]))


@pytest.mark.slow
def test_the_embedded_model_calls_the_calculator_in_the_preset(tmp_path):
    """The protocol is one the real SmolLM2-135M-Instruct follows, untrained: the preset's first step."""
    run_dir = tmp_path / "run"
    result = run_cli(
        "+experiment=calculator",
        "trainer.max_steps=1",
        *NO_SAVED_WEIGHTS,
        "dataset.eval_size=8",
        "eval.after=false",
        "logger=none",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["heldout_rollout_used_tool_frac_before"] >= 0.5
    [step] = [m for m in read_metrics(run_dir / "metrics.jsonl") if "reward" in m]
    assert step["rollout/tool_calls_mean"] > 0


LEDGER = '''
class Ledger:
    """An environment beside the calculator: its reset text joins the prompt; the policy may look the answer up."""

    def reset(self, question, solution, **row):
        self.solution = solution
        return "The ledger is open. " * 3

    def lookup(self, item: str) -> str:
        """Looks an item up in the ledger.

        Args:
            item: what to look up
        """
        return self.solution

    def get_reward(self) -> float:
        return 0.0
'''


TURN_TOKENS = 12


@pytest.mark.e2e  # the protocol_model fixture fine-tunes for a minute on 2 cores
@pytest.mark.parametrize("setting", ["tools", "environment"])
@pytest.mark.parametrize("decoding", ["greedy", "sampled"])
def test_cached_turns_play_the_trajectories_of_whole_prefills_token_for_token(
    protocol_model, setting, decoding, tmp_path, monkeypatch
):
    """rollout.cache_turns (grpo_exp.rollout.turn_cache) against every turn prefilled whole: the calculator's calls
    (beside an environment whose reset text joins the prompt), observations cut at max_observation_chars, turns that
    hit max_tokens_per_turn, a call on the last turn, trajectories ending at different turns. Greedy in two batches;
    sampled from one seed in one batch (the same draws, as the distributions agree to float rounding)."""
    overrides = [*MULTITURN, "rollout.max_observation_chars=12", f"rollout.max_tokens_per_turn={TURN_TOKENS}"]
    overrides += ["rollout.max_turns=2"]  # the tiny model calls the calculator once at most
    if setting == "environment":
        write_user_module(tmp_path, monkeypatch, "ledger", LEDGER)
        overrides += ["rollout=environment", "rollout.environment=ledger:Ledger", "rollout.tools=[calculator]"]
    cfg = compose_config(overrides)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = AutoModelForCausalLM.from_pretrained(protocol_model)
    rows = list(load_splits(cfg.dataset)[0])[:8]
    greedy = decoding == "greedy"
    generation = greedy_generation(tokenizer) if greedy else SAMPLING | {"pad_token_id": tokenizer.pad_token_id}
    played = {}
    for cached in (True, False):
        cfg.rollout.cache_turns = cached
        torch.manual_seed(3)
        trajectories = MultiTurnRollout(cfg.rollout).run(
            model, tokenizer, [r["prompt"] for r in rows], generation, 4 if greedy else 8, rows=rows
        )
        played[cached] = [(t.completion_ids, t.env_mask, t.turns, t.turn_rewards, t.ended, t.cut) for t in trajectories]
    assert played[True] == played[False]

    if not (greedy and setting == "environment"):  # greedy, without the calculator's demonstration it never calls
        assert any(0 in mask for _, mask, *_ in played[True]), "no observation was read"
    if setting == "environment":  # the reset text read after the task
        assert all(tokenizer.decode(t.prompt_ids).count("The ledger is open.") == 3 for t in trajectories)
    if not greedy:  # the greedy trajectories of the tiny model are all alike
        turns = [len(t.turns) for t in trajectories]
        assert max(turns) == cfg.rollout.max_turns and len(set(turns)) > 1, turns
        assert any(TURN_TOKENS in t.turn_tokens for t in trajectories), "no turn reached max_tokens_per_turn"
    for t in trajectories:  # cut: the last turn stopped at max_tokens_per_turn, with neither an EOS nor a call
        assert t.cut == (t.ended and t.completion_ids[-1] != tokenizer.eos_token_id)
        assert not t.cut or t.turn_tokens[-1] == TURN_TOKENS


@pytest.mark.e2e  # the protocol_model fixture fine-tunes for a minute on 2 cores
def test_cached_turns_record_the_log_probs_a_whole_forward_gives(protocol_model):
    """Sampled with rollout.cache_turns: each policy token's recorded log-probability is the one a teacher-forced
    forward over the whole trajectory gives (observations: 0.0, masked)."""
    cfg = compose_config(MULTITURN)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = AutoModelForCausalLM.from_pretrained(protocol_model).eval()
    prompts = [row["prompt"] for row in list(load_splits(cfg.dataset)[1])[:3]] * 2
    torch.manual_seed(0)
    sampling = SAMPLING | {"temperature": 0.7, "pad_token_id": tokenizer.pad_token_id}
    trajectories = MultiTurnRollout(cfg.rollout).run(model, tokenizer, prompts, sampling, 6, log_probs_at=0.7)
    assert any(t.tool_calls for t in trajectories)
    for t in trajectories:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([t.prompt_ids + t.completion_ids])).logits[0]
        predicted = logits[len(t.prompt_ids) - 1 : -1].float() / 0.7
        expected = torch.log_softmax(predicted, -1).gather(1, torch.tensor(t.completion_ids)[:, None])[:, 0]
        mask = torch.tensor(t.env_mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(t.logprobs)[mask], expected[mask], atol=1e-4, rtol=0)
        assert all(p == 0.0 for p, m in zip(t.logprobs, t.env_mask, strict=True) if not m)
