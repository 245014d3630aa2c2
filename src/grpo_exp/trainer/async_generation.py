"""generation=vllm_async: generation that does not wait for training (docs/async.md).

A vLLM server generates the batches of the coming steps while the trainer trains on the batch of this one. At the
start of each optimiser step (transformers' `get_batch_samples`, where the step's batches are drawn) the pipeline:
1. brings the server's weights to the policy's every `weight_sync_steps` steps, once the requests in flight have
   been answered (so that every completion comes from one known policy version);
2. draws the batches of the coming steps (`max_staleness - weight_sync_steps + 1` ahead) from the same data
   iterator, in the same order as a synchronous run, and sends each one's prompts to the server as it is drawn,
   tagged with the server's version;
3. hands the trainer this step's batch. When TRL asks for its completions (`generate`), they are the server's answer
   to that request: made by a policy `step - version` optimiser steps old. An answer older than `max_staleness` is
   dropped (and counted) and the batch is generated afresh from current weights; so is a batch whose prompts are not
   the ones sent (another row set: a resampled batch).

TRL's importance-sampling correction (vllm_importance_sampling_correction) weighs each token by the current policy
against the sampler's log-probability, which the server returns: it corrects staleness as it corrects the
sampler/trainer mismatch. With max_staleness=0 nothing is drawn ahead and the run is synchronous. To tell the two
apart, a stale batch's completions are scored again by the server once it holds the trainer's weights (`Rescored`):
the old against the new server log-probabilities is the staleness, the new against the trainer's the numerics
(grpo_exp.trainer.mismatch_stats.staleness_split_sums).

TRL's VLLMGeneration stays the server's client and the weight sync (NCCL on GPUs, a reload from the run directory
on CPU: grpo_exp.trainer.vllm_reload); `AsyncGeneration` stands in its place on the trainer, so TRL's own generation
code asks it for completions.
"""

import copy
import logging
import math
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import requests
import torch
from accelerate.utils import broadcast_object_list, gather_object
from omegaconf import OmegaConf
from transformers import TrainerCallback

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.rollout.vllm_turns import served_failure, server_url
from grpo_exp.run_files import BEFORE_STEP_SECONDS
from grpo_exp.trainer.trl_batch import RolloutFunc
from grpo_exp.trainer.vllm_engine import TRUNCATING

log = logging.getLogger(__name__)

# How long the trainer waits for the server before it says so (and again at each multiple).
WAIT_WARNING_SECONDS = 60.0


@dataclass
class Request:
    """One step's generation, sent ahead: this process's prompts (their ids; a multi-turn batch's messages), the
    server's weights version when sent, and the answer: (main process) the server's for every process's prompts, or
    (multi-turn, each process) this process's trajectories played on the server."""

    prompts: list
    version: int
    answer: Future | None = None


@dataclass
class Pipeline:
    """What the pipeline counts, for the step's metrics."""

    dropped: int = 0  # rows whose completions were older than max_staleness
    regenerated: int = 0  # batches generated afresh (too old, or not the prompts sent)
    waited: float = 0.0  # seconds the trainer waited for the server's answers (before a sync too), since then
    synced: float = 0.0  # seconds the weight syncs took, since the last metrics
    rescored: float = 0.0  # seconds the server took to score stale batches again, since the last metrics
    before_step: float = 0.0  # seconds at the start of the steps (sync, waits, sending), outside TRL's step_time
    staleness: list[int] = field(default_factory=list)  # each batch's, since the last metrics


@dataclass
class Rescored:
    """A stale batch's completions (this process's rows) and their log-probabilities under the server's current
    weights, the trainer's."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]]

    def aligned(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """[rows, tokens] beside TRL's batch (its padded completion ids); NaN where a row is not the one scored
        (another batch's: a resampled row) and past each completion."""
        out = torch.full(completion_ids.shape, math.nan, dtype=torch.float32)
        for row, (ids, logprobs) in enumerate(zip(self.completion_ids, self.logprobs, strict=True)):
            if row < len(out) and completion_ids[row, : len(ids)].tolist() == ids:
                out[row, : len(logprobs)] = torch.tensor(logprobs)
        return out.to(completion_ids.device)


def prompt_logprobs(choice: dict, completion: list[int]) -> list[float]:
    """The completion's tokens' log-probabilities from a /v1/completions choice of prompt + completion, scored
    with prompt_logprobs=0 (each position holds its own token's)."""
    scored = choice["prompt_logprobs"][-len(completion) :] if completion else []
    return [position[str(token)]["logprob"] for position, token in zip(scored, completion, strict=True)]


def sampling_params(generation, num_generations: int) -> dict:
    """TRL's server request for a batch, as TRL's VLLMGeneration.generate builds it (trl 1.16)."""
    return {
        "n": num_generations,
        "repetition_penalty": generation.repetition_penalty,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "min_p": 0.0 if generation.min_p is None else generation.min_p,
        "max_tokens": generation.max_completion_length,
        "logprobs": generation.logprobs,
        "structured_outputs_regex": generation.structured_outputs_regex,
        "generation_kwargs": generation.generation_kwargs,
    }


class AsyncGeneration:
    """TRL's VLLMGeneration (server mode) with requests sent ahead: on the trainer in its place. `step()`: the
    trainer's optimiser step (global_step); `tokenize(rows)`: TRL's prompt ids of a batch's rows."""

    def __init__(
        self, generation, *, max_staleness: int, weight_sync_steps: int, num_generations: int, step, tokenize,
        split_mismatch: bool = False, play=None,
    ):  # fmt: skip
        """`split_mismatch`: stale batches are scored again to split the mismatch (trainer.mismatch_metrics=true).
        `play(prompts, rows) -> trajectories`: a multi-turn run's batch played on the server, turn by turn (grpo_exp.
        trainer.trl_batch.RolloutFunc.play_ahead), each process its own rows; None: single-turn batches."""
        self.generation, self.accelerator = generation, generation.accelerator
        self.split_mismatch = split_mismatch
        self.max_staleness, self.weight_sync_steps = max_staleness, weight_sync_steps
        # A batch sent `ahead` steps early, from weights up to weight_sync_steps - 1 steps older than the step it was
        # sent at, is at most max_staleness old when trained on (check_async_generation: weight_sync_steps <=
        # max_staleness + 1).
        self.lookahead = max_staleness - weight_sync_steps + 1
        self.num_generations, self.step, self.tokenize = num_generations, step, tokenize
        self.url = server_url(generation)
        self.pool = ThreadPoolExecutor(max_workers=max_staleness + 1, thread_name_prefix="vllm-async")
        self.ahead: deque[tuple[list, object, Request]] = deque()  # (the step's batches, their item count, request)
        self.current: Request | None = None  # the request of the step being trained
        self.iterator = None  # the epoch's data iterator the batches ahead were drawn from
        self.version = -1  # the optimiser step whose weights the server holds (-1: not synced yet)
        self.counts = Pipeline()
        self.rescored: Rescored | None = None  # the last batch's, where it was stale (take_rescored)
        self.served_name: str | None = None  # the server's name for its model, asked once
        self.play = play

    def __getattr__(self, name):  # everything else is TRL's VLLMGeneration's
        return getattr(self.generation, name)

    # ---- the step's batches (transformers' get_batch_samples) ----------------------------------------------

    def batches_for_step(self, epoch_iterator, draw):
        """This step's (batches, items), drawn by `draw(epoch_iterator)` (transformers' own get_batch_samples), with
        the steps up to max_staleness ahead drawn and sent to the server. Timed: TRL's step_time starts after it."""
        started = time.perf_counter()
        try:
            return self._batches_for_step(epoch_iterator, draw)
        finally:
            self.counts.before_step += time.perf_counter() - started

    def _batches_for_step(self, epoch_iterator, draw):
        if epoch_iterator is not self.iterator:  # a new epoch: nothing of the last one is left ahead
            self.ahead.clear()
            self.iterator = epoch_iterator
        if self.step() - self.version >= self.weight_sync_steps or self.version < 0:
            self._sync()
        while len(self.ahead) <= self.lookahead:
            batches, items = draw(epoch_iterator)
            if not batches:
                break
            self.ahead.append((batches, items, self._send(batches[0])))
        if not self.ahead:
            return [], None
        batches, items, self.current = self.ahead.popleft()
        return batches, items

    # ---- TRL's VLLMGeneration interface ------------------------------------------------------------------

    def sync_weights(self):
        """TRL calls this before every step's generation: the pipeline syncs on its own schedule instead."""

    def sync_now(self):
        """The server's weights brought to the policy's now (evaluation samples from the current policy)."""
        if self.version != self.step():
            self._sync()

    def generate(self, prompts, images, num_generations, profiler=None):
        """TRL's generate: the completions sent ahead for these prompts, or (too old, or other prompts) afresh."""
        taken = self._take_sent(prompts, images is None)
        if taken is None:
            return self.generation.generate(prompts, images, num_generations, profiler)
        request, staleness = taken
        payload = [self._answer(request, staleness) if self.accelerator.is_main_process else None]
        broadcast_object_list(payload, from_process=0)  # the server's failure too: every process stops with it
        if isinstance(payload[0], str):
            raise UserError(payload[0])
        prompt_ids, completion_ids, logprobs, logprob_token_ids, rescored = payload[0]
        rows = slice(self.accelerator.process_index * len(prompts), (self.accelerator.process_index + 1) * len(prompts))
        prompt_ids = [ids for ids in prompt_ids for _ in range(num_generations)]
        if rescored is not None:
            self.rescored = Rescored(completion_ids[rows], rescored[rows])
        return (
            prompt_ids[rows],
            completion_ids[rows],
            None if logprobs is None else logprobs[rows],
            None if logprob_token_ids is None else logprob_token_ids[rows],
        )

    def trajectories(self, prompts: list, play_now) -> list:
        """A multi-turn batch's trajectories (TRL's rollout_func): those played ahead for these prompts, or (too old,
        or other prompts: a resampled batch) `play_now()`'s, on the server synced to the policy."""
        taken = self._take_sent(prompts)
        if taken is None:
            return play_now()
        request, _ = taken
        played = self._wait(request, "to play the trajectories of step")
        failures = [failure for failure in gather_object([played if isinstance(played, str) else None]) if failure]
        if failures:  # any process's: every process stops with it
            raise UserError(failures[0])
        return played

    def _take_sent(self, prompts: list, sendable: bool = True) -> tuple[Request, int] | None:
        """The request sent ahead for this step's `prompts` and its staleness; None (counted, the server synced to
        the policy) where the batch must be generated now: too old, other prompts (a resampled batch), or not
        `sendable`, on any process."""
        request, self.current, self.rescored = self.current, None, None
        sent = request is not None and request.prompts == prompts and sendable
        staleness = self.step() - request.version if sent else 0
        fresh = sent and staleness <= self.max_staleness
        if not all(gather_object([fresh])):  # every process takes the same path (collective calls follow)
            if sent and staleness > self.max_staleness:
                self.counts.dropped += len(prompts) * self.accelerator.num_processes
            self.counts.regenerated += 1
            self.sync_now()
            self.counts.staleness.append(0)
            return None
        self.counts.staleness.append(staleness)
        return request, staleness

    def take_rescored(self) -> Rescored | None:
        """The last batch's completions scored again under the trainer's weights (the same on every process: set or
        not), once: None where it was on-policy, or could not be scored again (see _rescoring)."""
        rescored, self.rescored = self.rescored, None
        return rescored

    # ---- metrics and the end ---------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """The pipeline's figures since the last call: each batch's staleness (mean, max), the rows dropped (in all),
        the seconds waited for the server and spent syncing."""
        counts = self.counts
        figures = {
            "async/dropped_total": float(counts.dropped),
            "async/regenerated_total": float(counts.regenerated),
            "async/wait_seconds": counts.waited,
            "async/sync_seconds": counts.synced,
            "async/rescore_seconds": counts.rescored,
            BEFORE_STEP_SECONDS: counts.before_step,
        }
        if counts.staleness:
            figures["async/staleness_mean"] = sum(counts.staleness) / len(counts.staleness)
            figures["async/staleness_max"] = float(max(counts.staleness))
        counts.staleness, counts.waited, counts.synced, counts.rescored, counts.before_step = [], 0.0, 0.0, 0.0, 0.0
        return figures

    def close(self) -> None:
        """Requests still ahead are dropped (they are drawn again on resume)."""
        self.ahead.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- the server ------------------------------------------------------------------------------------------

    def _send(self, rows: list[dict]) -> Request:
        if self.play is not None:  # each process plays its own rows' trajectories, turn by turn
            prompts = [row["prompt"] for row in rows]
            return Request(prompts, self.version, self.pool.submit(self.play, copy.deepcopy(prompts), rows))
        prompt_ids = self.tokenize(rows)
        everyone = gather_object(prompt_ids)
        answer = None
        if self.accelerator.is_main_process:
            params = sampling_params(self.generation, self.num_generations)
            unique = everyone[:: self.num_generations]
            answer = self.pool.submit(self.generation.vllm_client.generate, prompts=unique, **params)
        return Request(prompt_ids, self.version, answer)

    def _wait(self, request: Request, what: str):
        """A request's answer, waited for: a wait is timed, and said when it is long. Where the server failed, what
        to tell the user (a str)."""
        started = time.perf_counter()
        try:
            while True:
                try:
                    return request.answer.result(timeout=WAIT_WARNING_SECONDS)
                except TimeoutError:
                    log.warning(
                        "generation=vllm_async: waiting for the vLLM server at %s for %.0f s (step %d)",
                        self.url,
                        time.perf_counter() - started,
                        self.step(),
                    )
                except UserError as err:  # the turns' engine says what failed, naming the server
                    return str(err)
                except Exception as err:  # the server died or refused: the run stops, naming it
                    return str(served_failure(self.url, f"{what} {self.step()}", err))
        finally:
            self.counts.waited += time.perf_counter() - started

    def _answer(self, request: Request, staleness: int) -> tuple | str:
        """The server's answer (main process), waited for (_wait); with a stale batch's log-probabilities under the
        current weights (None: not scored again). Where the server failed, what to tell the user."""
        output = self._wait(request, "to generate the batch of step")
        if isinstance(output, str):
            return output
        prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
        rescored = self._rescore(prompt_ids, completion_ids) if self._rescoring(staleness) else None
        return prompt_ids, completion_ids, output["logprobs"], output.get("logprob_token_ids"), rescored

    def _rescoring(self, staleness: int) -> bool:
        """A stale batch is scored again, where asked, where the server holds the trainer's weights (a sync this
        step) and samples the model's own distribution (check_split_sampling)."""
        return self.split_mismatch and staleness > 0 and self.version == self.step()

    def _rescore(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]] | None:
        """Each completion's log-probabilities under the server's current weights: prompt and completion sent back
        as a prompt, scored by vLLM's prompt_logprobs (a prefill, no generation). None (said) where the server
        cannot: the split is a measurement, the batch trains without it."""
        started = time.perf_counter()
        rows = [prompt_ids[i // self.num_generations] + ids for i, ids in enumerate(completion_ids)]
        try:
            if self.served_name is None:
                self.served_name = requests.get(f"{self.url}/v1/models", timeout=60).json()["data"][0]["id"]
            request = {"model": self.served_name, "prompt": rows, "max_tokens": 1, "prompt_logprobs": 0}
            response = requests.post(f"{self.url}/v1/completions", json=request, timeout=600)
            response.raise_for_status()
            choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
            scored = [prompt_logprobs(choice, ids) for choice, ids in zip(choices, completion_ids, strict=True)]
        except Exception as err:  # any server's answer, well formed or not: the batch trains without the split
            log.warning(
                "generation=vllm_async: the server at %s did not score the stale batch again (%s)", self.url, err
            )
            return None
        finally:
            self.counts.rescored += time.perf_counter() - started
        return scored

    def _sync(self) -> None:
        """The server's weights brought to the policy's, once the requests in flight are answered (each completion
        comes from one version)."""
        started = time.perf_counter()
        if self.accelerator.is_main_process or self.play is not None:  # a failed request is told when its batch is
            wait([request.answer for _, _, request in self.ahead if request.answer is not None])  # trained on
        if self.play is not None:  # every process's trajectories in flight finished before any weight moves
            self.accelerator.wait_for_everyone()
        synced = time.perf_counter()
        self.counts.waited += synced - started  # the trainer waiting for generation, as for a batch
        self.generation.sync_weights()
        self.version = self.step()
        self.counts.synced += time.perf_counter() - synced


# ---- its rules, checked at resolve time --------------------------------------------------------------------------

# Settings that choose each step's prompts from the last steps' results, which prompts drawn ahead cannot follow.
CHOSEN_FROM_RESULTS = (
    ("curriculum.enabled", "the difficulty curriculum draws each step's prompts from the last pass rates"),
    ("dataset.levels.enabled", "the task levels draw each step's prompts at the level the last validation set"),
)


def check_async_generation(
    cfg, *, multiturn: bool, own_prompts: str | None = None, native_tool_calling: bool = False
) -> None:
    """trainer.max_staleness (generation=vllm_async): a vLLM server, batches drawn from the data in order (single-turn,
    or multi-turn played by grpo_exp's loop), one generation per optimiser step, and a sync at least as often as the
    bound allows. `own_prompts`: what of the run mixes prompts of its own into the batches, as the refusal names it (a
    reward component's task, grpo_exp.rewards.components.Task: "the self-verification task (reward selfverify)"),
    None: nothing. `native_tool_calling`: TRL's tool-calling loop plays the turns (rollout.tool_calling)."""
    trainer = cfg.trainer
    staleness = trainer.max_staleness
    if staleness is None:
        return
    prefix = f"trainer.max_staleness={staleness} (generation=vllm_async)"
    extra = trainer.extra
    if not extra.get("use_vllm") or extra.get("vllm_mode", "server") != "server":
        raise UserError(
            f"{prefix} generates ahead on a vLLM server: it needs trainer.extra.use_vllm=true and "
            "trainer.extra.vllm_mode=server (generation=vllm_async sets both), or trainer.max_staleness=null"
        )
    if trainer.weight_sync_steps > staleness + 1:
        raise UserError(
            f"trainer.weight_sync_steps={trainer.weight_sync_steps} with {prefix}: between two syncs the server's "
            f"batches would grow older than the bound and be dropped; set trainer.weight_sync_steps to at most "
            f"{staleness + 1}, or raise trainer.max_staleness"
        )
    if trainer.num_iterations > 1:
        raise UserError(
            f"trainer.num_iterations={trainer.num_iterations} with {prefix}: the pipeline sends one batch per "
            "optimiser step; set trainer.num_iterations=1"
        )
    if own_prompts is not None:
        raise UserError(
            f"{prefix}: {own_prompts} is not generated ahead (its prompts come from recent samples); use "
            "generation=vllm_server"
        )
    if multiturn and native_tool_calling:
        raise UserError(
            f"rollout.tool_calling={OmegaConf.select(cfg, 'rollout.tool_calling')} with {prefix}: TRL's tool-calling "
            "loop plays these turns, and generation ahead plays grpo_exp's; set rollout.tool_calling=tags, or "
            "generation=vllm_server"
        )
    if multiturn and trainer.mismatch_metrics:
        raise UserError(
            f"trainer.mismatch_metrics=true with {prefix} and a multi-turn rollout: the staleness/numerics split "
            "scores single-turn batches again, not trajectories; set trainer.mismatch_metrics=null (TRL's sampling/* "
            "still measure the whole mismatch)"
        )
    for key, why in CHOSEN_FROM_RESULTS:
        if OmegaConf.select(cfg, key):
            raise UserError(f"{key}=true with {prefix}: {why}, which prompts sent ahead cannot follow")
    if trainer.mismatch_metrics:
        check_split_sampling(trainer, prefix)


# What changes vLLM's sampling distribution from the model's own, at the values that leave it as it is.
UNTRANSFORMED = {"temperature": 1.0, **TRUNCATING, "repetition_penalty": 1.0}


def check_split_sampling(trainer, prefix: str) -> None:
    """trainer.mismatch_metrics=true with generation ahead splits each stale batch's mismatch by scoring it again
    with vLLM's prompt log-probabilities, which are the model's own: exact only where the sampler's are too
    (processed_logprobs: after temperature, truncation and penalties), and only on steps where the server holds the
    trainer's weights, which a stale batch reaches only if the server syncs before the bound."""
    extra = trainer.extra
    given = {"temperature": trainer.temperature, "top_p": trainer.top_p}
    given |= {key: extra[key] for key in ("top_k", "min_p", "repetition_penalty") if extra.get(key) is not None}
    for key, value in given.items():
        if value != UNTRANSFORMED[key] and not (key == "top_k" and value == -1):
            where = f"trainer.{key}" if key in ("temperature", "top_p") else f"trainer.extra.{key}"
            raise UserError(
                f"trainer.mismatch_metrics=true with {prefix} splits the mismatch by scoring stale batches again "
                f"with the model's own log-probabilities, and {where}={value} samples another distribution: set "
                f"{where}={UNTRANSFORMED[key]}, or trainer.mismatch_metrics=null"
            )
    if trainer.max_staleness == 0:
        raise UserError(
            f"trainer.mismatch_metrics=true with {prefix}: every batch is on-policy, with no staleness to split from "
            "the numerics (TRL's sampling/* are the numerics alone); set trainer.mismatch_metrics=null"
        )
    if trainer.weight_sync_steps > trainer.max_staleness:
        raise UserError(
            f"trainer.mismatch_metrics=true with {prefix} and trainer.weight_sync_steps={trainer.weight_sync_steps}: "
            "the split is measured on the steps where the server holds the trainer's weights, and with a sync "
            f"every {trainer.weight_sync_steps} steps no stale batch is trained on such a step; set "
            f"trainer.weight_sync_steps to at most {trainer.max_staleness}, or trainer.mismatch_metrics=null"
        )


# ---- on the trainer ----------------------------------------------------------------------------------------------


class PipelineCallback(TrainerCallback):
    """The pipeline's figures join the step's metrics; at the end of training, what is still ahead is dropped."""

    def __init__(self, trainer, pipeline: AsyncGeneration):
        self.trainer, self.pipeline = trainer, pipeline

    def on_step_end(self, args, state, control, **kwargs):
        for key, value in self.pipeline.metrics().items():
            self.trainer.record_metric(key, value)

    def on_train_end(self, args, state, control, **kwargs):
        self.pipeline.close()


def generation_ahead(trainer) -> AsyncGeneration | None:
    """generation=vllm_async (trainer.max_staleness set): the pipeline in place of the trainer's TRL VLLMGeneration,
    with its callback; None otherwise."""
    args = trainer.args
    if args.max_staleness is None:
        return None
    pipeline = AsyncGeneration(
        trainer.vllm_generation,
        max_staleness=args.max_staleness,
        weight_sync_steps=args.weight_sync_steps,
        num_generations=trainer.num_generations,
        step=lambda: trainer.state.global_step,
        tokenize=trainer.prompt_ids,
        split_mismatch=bool(args.mismatch_metrics),
        play=trainer.rollout_func.play_ahead(trainer) if isinstance(trainer.rollout_func, RolloutFunc) else None,
    )
    trainer.vllm_generation = pipeline
    trainer.add_callback(PipelineCallback(trainer, pipeline))
    return pipeline


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("trainer.weight_sync_steps",),
        lambda cfg: cfg.trainer.max_staleness is not None,
        "by generation ahead (generation=vllm_async)",
        lambda cfg: "trainer.max_staleness=null generates synchronously (TRL syncs the weights every step)",
        "add generation=vllm_async (or set trainer.max_staleness)",
    ),
)
