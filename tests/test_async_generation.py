"""generation=vllm_async (grpo_exp.trainer.async_generation): the pipeline's bound on staleness and its order, its
rules, and a failing server stopping the run with its address named. The real server's runs are in test_vllm.py."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from grpo_exp.errors import UserError
from grpo_exp.trainer.async_generation import AsyncGeneration, check_async_generation
from support.config import TINY_RUN, compose_config

G = 2


class ServerGeneration:
    """Stands for TRL's VLLMGeneration in server mode, its client and its weight sync: each completion is one token,
    the version of the weights the server held when it generated it (the trainer's step at the last sync)."""

    def __init__(self, trainer_step):
        self.accelerator = SimpleNamespace(
            num_processes=1, process_index=0, is_main_process=True, wait_for_everyone=lambda: None
        )
        self.server_base_url, self.trainer_step, self.server_version = "http://server", trainer_step, None
        self.repetition_penalty, self.temperature, self.top_p, self.top_k, self.min_p = 1.0, 1.0, 1.0, 0, None
        self.max_completion_length, self.logprobs, self.structured_outputs_regex = 4, 0, None
        self.generation_kwargs = {}
        self.vllm_client, self.syncs, self.generated_now = SimpleNamespace(generate=self.answer), 0, 0

    def sync_weights(self):
        self.server_version, self.syncs = self.trainer_step(), self.syncs + 1

    def answer(self, prompts, n, **params):  # the client's request: each prompt once, n completions of it
        time.sleep(0.01)  # answered a little later, as a server does: a sync must wait for it
        rows = [ids for ids in prompts for _ in range(n)]
        return {
            "prompt_ids": prompts,
            "completion_ids": [[self.server_version] for _ in rows],
            "logprobs": [[[-1.0]] for _ in rows],
        }

    def generate(self, prompts, images, num_generations, profiler=None):  # TRL's, at once (every process's rows)
        self.generated_now += 1
        output = self.answer(prompts[::num_generations], num_generations)
        return prompts, output["completion_ids"], output["logprobs"], None


def pipeline_over(step: dict, max_staleness: int = 1, weight_sync_steps: int = 1, **settings):
    """The pipeline in front of a ServerGeneration, both at the training loop's step (`step["now"]`); each row's prompt
    its own token."""
    server = ServerGeneration(lambda: step["now"])
    pipeline = AsyncGeneration(
        server,
        max_staleness=max_staleness,
        weight_sync_steps=weight_sync_steps,
        num_generations=G,
        step=lambda: step["now"],
        tokenize=lambda rows: [[row["prompt"]] for row in rows],
        **settings,
    )
    return server, pipeline


def trained_versions(max_staleness: int, weight_sync_steps: int, steps: int = 12) -> tuple[list, list, dict]:
    """A training loop's use of the pipeline: each step draws its batch, then asks for its completions. Returns each
    step's batch (its prompt), the version its completions came from, and the pipeline's last figures."""
    step = {"now": 0}
    server, pipeline = pipeline_over(step, max_staleness, weight_sync_steps)
    data = iter([[{"prompt": b}] * G] for b in range(steps))

    def draw(iterator):
        batch = next(iterator, None)
        return ([], None) if batch is None else (batch, None)

    batches, versions, staleness = [], [], []
    for now in range(steps):
        step["now"] = now
        (rows,), _ = pipeline.batches_for_step(data, draw)
        prompt_ids = [[row["prompt"]] for row in rows]
        _, completion_ids, _, _ = pipeline.generate(prompt_ids, None, G)
        batches.append(rows[0]["prompt"])
        versions.append(completion_ids[0][0])
        staleness.append(pipeline.metrics()["async/staleness_max"])
    assert staleness == [now - version for now, version in enumerate(versions)]  # what it reports is so
    pipeline.close()
    return batches, versions, {"syncs": server.syncs, "dropped": pipeline.counts.dropped}


@pytest.mark.parametrize(("max_staleness", "weight_sync_steps"), [(0, 1), (1, 1), (2, 1), (2, 2), (2, 3), (3, 2)])
def test_no_batch_older_than_the_bound_is_trained_on_and_none_is_skipped(max_staleness, weight_sync_steps):
    batches, versions, counts = trained_versions(max_staleness, weight_sync_steps)
    assert batches == list(range(12))  # the data's order, as a synchronous run draws it
    staleness = [step - version for step, version in enumerate(versions)]
    assert max(staleness) <= max_staleness and counts["dropped"] == 0, staleness
    lookahead = max_staleness - weight_sync_steps + 1
    assert min(staleness[lookahead:]) >= lookahead  # once the pipeline is full, every batch was sent that far ahead
    assert counts["syncs"] == -(-12 // weight_sync_steps)  # every weight_sync_steps steps, from the first


def test_max_staleness_0_is_on_policy():
    _, versions, counts = trained_versions(0, 1)
    assert versions == list(range(12)) and counts["syncs"] == 12


def test_a_batch_older_than_the_bound_is_dropped_and_generated_from_current_weights():
    step = {"now": 0}
    server, pipeline = pipeline_over(step)
    data = iter([[{"prompt": b}] * G] for b in range(4))
    pipeline.batches_for_step(data, lambda iterator: (next(iterator), None))  # step 0: sent with version 0
    step["now"] = 3  # its completions are asked for 3 steps later
    _, completion_ids, _, _ = pipeline.generate([[0]] * G, None, G)
    assert completion_ids == [[3]] * G and server.generated_now == 1  # afresh, from weights synced to step 3
    assert pipeline.counts.dropped == G and pipeline.metrics()["async/regenerated_total"] == 1
    pipeline.close()


# ---- multi-turn trajectories, played ahead ------------------------------------------------------------------------


def played_by(server: ServerGeneration, failing: set | None = None):
    """Stands for a multi-turn rollout on the server (RolloutFunc.play_ahead): each trajectory (its prompt, the
    weights version of its every turn), its turns taking a while; a prompt in `failing` fails as a dead server does."""

    def play(prompts: list, rows: list[dict]) -> list:
        turns = []
        for _ in range(3):
            time.sleep(0.005)
            turns.append(server.server_version)
        if failing and prompts[0] in failing:
            raise ConnectionError("Connection refused")
        return [(prompt, row["prompt"], list(turns)) for prompt, row in zip(prompts, rows, strict=True)]

    return play


@pytest.mark.parametrize(("max_staleness", "weight_sync_steps"), [(0, 1), (1, 1), (2, 1), (2, 2)])
def test_multi_turn_trajectories_are_played_ahead_each_from_one_version_none_older_than_the_bound(
    max_staleness, weight_sync_steps
):
    """A multi-turn batch sent ahead is played out turn by turn in the pipeline's worker; the weights move only once
    every trajectory in flight has finished, so all the turns of a trajectory come from one version, and no batch is
    older than the bound when trained on."""
    step = {"now": 0}
    server = ServerGeneration(lambda: step["now"])
    pipeline = AsyncGeneration(
        server, max_staleness=max_staleness, weight_sync_steps=weight_sync_steps, num_generations=G,
        step=lambda: step["now"], tokenize=None, play=played_by(server),
    )  # fmt: skip
    data = iter([[{"prompt": f"p{b}"}] * G] for b in range(10 + max_staleness))
    staleness = []
    for now in range(10):
        step["now"] = now
        (rows,), _ = pipeline.batches_for_step(data, lambda iterator: (next(iterator), None))
        prompts = [row["prompt"] for row in rows]
        trajectories = pipeline.trajectories(prompts, lambda: pytest.fail("played again"))
        assert [t[0] for t in trajectories] == prompts == [f"p{now}"] * G  # the data's order, rows and prompts
        (version,) = {turn for t in trajectories for turn in t[2]}  # every turn from one version
        staleness.append(now - version)
        assert pipeline.metrics()["async/staleness_max"] == now - version
    lookahead = max_staleness - weight_sync_steps + 1
    assert max(staleness) <= max_staleness and min(staleness[lookahead:]) >= lookahead, staleness
    assert pipeline.counts.dropped == 0 and pipeline.counts.regenerated == 0
    pipeline.close()


def test_a_resampled_multi_turn_batch_is_played_now_and_a_failed_one_stops_the_run_naming_the_server():
    step = {"now": 0}
    server = ServerGeneration(lambda: step["now"])
    pipeline = AsyncGeneration(
        server, max_staleness=1, weight_sync_steps=1, num_generations=G, step=lambda: step["now"], tokenize=None,
        play=played_by(server, failing={"p1"}),
    )  # fmt: skip
    data = iter([[{"prompt": f"p{b}"}] * G] for b in range(4))
    draw = lambda iterator: (next(iterator), None)  # noqa: E731
    pipeline.batches_for_step(data, draw)
    assert pipeline.trajectories(["other"] * G, lambda: "played now") == "played now"  # not the prompts sent
    assert pipeline.metrics()["async/regenerated_total"] == 1
    step["now"] = 1
    pipeline.batches_for_step(data, draw)
    with pytest.raises(UserError, match="http://server.*step 1.*Connection refused"):
        pipeline.trajectories(["p1"] * G, lambda: pytest.fail("played again"))
    pipeline.close()


# ---- its rules ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "multiturn", "message"),
    [
        (["trainer.max_staleness=1"], False, "trainer.extra.use_vllm=true and trainer.extra.vllm_mode=server"),
        (["generation=vllm_colocate", "trainer.max_staleness=1"], False, "vllm_mode=server"),
        (["generation=vllm_async", "trainer.weight_sync_steps=3"], False, "trainer.weight_sync_steps to at most 2"),
        (["generation=vllm_async", "trainer.num_iterations=2"], False, "set trainer.num_iterations=1"),
        (["generation=vllm_async", "+experiment=calculator", "trainer.mismatch_metrics=true"], True, "trajectories"),
        (["generation=vllm_async", "curriculum.enabled=true"], False, "curriculum.enabled=true"),
    ],
)
def test_what_cannot_be_generated_ahead_is_refused_naming_the_key(overrides, multiturn, message):
    with pytest.raises(UserError, match="max_staleness") as refused:
        check_async_generation(compose_config(overrides), multiturn=multiturn)
    assert message in str(refused.value)


def test_multi_turn_is_generated_ahead_on_grpo_exps_loop_and_refused_on_trls_naming_the_key():
    calculator = compose_config(["generation=vllm_async", "+experiment=calculator"])
    check_async_generation(calculator, multiturn=True)  # grpo_exp's loop: played ahead
    with pytest.raises(UserError, match="rollout.tool_calling=.*TRL's tool-calling loop.*rollout.tool_calling=tags"):
        check_async_generation(calculator, multiturn=True, native_tool_calling=True)


def test_weight_sync_steps_without_generation_ahead_is_refused_as_inert():
    from grpo_exp.run.inert import check_only_with

    with pytest.raises(UserError, match="trainer.weight_sync_steps=2.*generation=vllm_async"):
        check_only_with(compose_config(["trainer.weight_sync_steps=2"]))
    check_async_generation(compose_config(["generation=vllm_async"]), multiturn=False)


# ---- a server that fails -----------------------------------------------------------------------------------------


class FailingServer(BaseHTTPRequestHandler):
    """A vLLM server's endpoints that the trainer's client and weight sync call, answering; its generation fails."""

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        replies = {
            "/v1/models": {"data": [{"id": "smollm2_135m"}]},
            "/server_info": {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}},
        }
        self._reply(200, next((body for path, body in replies.items() if self.path.startswith(path)), {}))

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/v1/completions"):
            self._reply(400, {"error": {"message": "EngineDeadError: the engine core died"}})
        else:
            self._reply(200, {})

    def log_message(self, *args):
        pass


TRAINING_FIRST = ["eval.before=false", "probe.labels_check=off"]  # nothing generates before the first step


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("overrides", "failed"),
    [
        (["generation=vllm_async", *TRAINING_FIRST], "to generate the batch of step 0"),
        (["generation=vllm_server", *TRAINING_FIRST], "to generate a batch"),
        (["generation=vllm_server"], "to generate a turn"),  # the labels check before training
    ],
)
def test_a_server_that_fails_to_generate_stops_the_run_naming_it(tmp_path, overrides, failed):
    from tests.helpers.cli import run_cli

    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        result = run_cli(
            *TINY_RUN,
            *overrides,
            f"trainer.extra.vllm_server_port={port}",
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
        )
    finally:
        server.shutdown()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"the vLLM server at http://127.0.0.1:{port} failed {failed}" in result.stderr, result.stderr[-3000:]
    assert "EngineDeadError" in result.stderr


# ---- the staleness part and the numerical part of a stale batch's difference ----------------------------------


def test_a_stale_batch_splits_into_the_policys_move_and_the_numerics():
    """|current - sampler| is the staleness (same numerics, the policy moved), |trainer - current| the numerics
    (same weights), over the loss's tokens that were scored again."""
    import math

    import torch

    from grpo_exp.trainer.mismatch_stats import staleness_split_metrics, staleness_split_sums

    exact = torch.float64  # the sums' own precision, so that the figures below are exact
    sampler = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, math.nan]], dtype=exact)
    current = torch.tensor([[-1.5, -2.0, -2.0], [-1.2, math.nan, -1.0]], dtype=exact)  # row 1's 2nd: not scored
    trainer = current + torch.tensor([[1e-5, -1e-5, 1e-5], [2e-5, 0.0, 0.0]], dtype=exact)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # row 0's 3rd token outside the loss; row 1's 3rd is padding (NaN)
    sums = staleness_split_sums(trainer, sampler, current, mask)
    assert sums.tolist() == pytest.approx([3.0, 0.5 + 0.0 + 0.2, 1e-5 + 1e-5 + 2e-5])
    other_process = torch.tensor([1.0, 0.3, 0.0], dtype=torch.float64)
    metrics = staleness_split_metrics(torch.stack([sums, other_process]))
    assert metrics == pytest.approx(
        {"async/staleness_logp_difference/mean": 1.0 / 4, "async/numerics_logp_difference/mean": 4e-5 / 4}
    )
    assert staleness_split_metrics(torch.zeros(2, 3, dtype=torch.float64)) == {}  # no token scored: nothing said


def test_the_scores_again_sit_beside_trls_rows_and_only_on_the_rows_scored():
    import math

    import torch

    from grpo_exp.trainer.async_generation import Rescored, prompt_logprobs

    choice = {"prompt_logprobs": [None, {"7": {"logprob": -0.5}}, {"4": {"logprob": -0.25}}, {"9": {"logprob": -2.0}}]}
    assert prompt_logprobs(choice, [4, 9]) == [-0.25, -2.0]  # the completion's tokens, the prompt's left out
    assert prompt_logprobs(choice, []) == []
    rescored = Rescored(completion_ids=[[4, 9], [5]], logprobs=[[-0.25, -2.0], [-1.0]])
    trls = torch.tensor([[4, 9, 0], [6, 0, 0]])  # row 1 is another completion (a resampled row): not scored
    aligned = rescored.aligned(trls)
    assert aligned[0, :2].tolist() == [-0.25, -2.0] and math.isnan(aligned[0, 2])
    assert torch.isnan(aligned[1]).all()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.temperature=0.7"],
            "trainer.temperature=0.7 samples another distribution: set trainer.temperature=1.0",
        ),
        (["trainer.top_p=0.9", "trainer.mismatch_correction=none"], "trainer.top_p=0.9 samples another distribution"),
        (["+trainer.extra.repetition_penalty=1.1"], "trainer.extra.repetition_penalty=1.1 samples another"),
        (["trainer.max_staleness=0"], "every batch is on-policy"),
        (["trainer.max_staleness=2", "trainer.weight_sync_steps=3"], "trainer.weight_sync_steps to at most 2"),
    ],
)
def test_the_mismatch_split_is_refused_where_it_could_not_be_exact_or_never_measured(overrides, message):
    """trainer.mismatch_metrics=true splits stale batches with vLLM's prompt log-probabilities, the model's own: not
    with a sampler that transforms them, nor where no stale batch is trained while the server holds the trainer's
    weights; refused naming the key, and accepted at the defaults and where a sync comes before the bound."""
    cfg = compose_config(["generation=vllm_async", "trainer.mismatch_metrics=true", *overrides])
    with pytest.raises(UserError, match="trainer.mismatch_metrics=true") as refused:
        check_async_generation(cfg, multiturn=False)
    assert message in str(refused.value)
    for accepted in ([], ["trainer.max_staleness=3", "trainer.weight_sync_steps=2"], ["+trainer.extra.top_k=-1"]):
        check_async_generation(
            compose_config(["generation=vllm_async", "trainer.mismatch_metrics=true", *accepted]), multiturn=False
        )


def test_a_server_that_cannot_score_a_batch_again_leaves_it_to_train_without_the_split(caplog):
    """The split is a measurement: an answer the pipeline cannot read (a server that ignores prompt_logprobs) is
    said in a warning, and the stale batch trains as it came."""
    step = {"now": 0}
    _, pipeline = pipeline_over(step, split_mismatch=True)
    pipeline.url = "http://127.0.0.1:9"  # nothing listens there: the request fails at once
    data = iter([[{"prompt": b}] * G] for b in range(4))
    draw = lambda iterator: (next(iterator), None)  # noqa: E731
    for now in range(2):
        step["now"] = now
        (rows,), _ = pipeline.batches_for_step(data, draw)
        _, completion_ids, _, _ = pipeline.generate([[row["prompt"]] for row in rows], None, G)
    assert completion_ids == [[0]] * G  # step 1 trained on step 0's weights' batch, unscored
    assert pipeline.take_rescored() is None and "did not score the stale batch again" in caplog.text
    pipeline.close()
