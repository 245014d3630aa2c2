"""Multi-turn, tool-using rollouts (rollout=multiturn): Flow-GRPO's outcome reward for every turn, on TRL.

A trajectory is one TRL completion: the policy's turns with the tools' observations between them. A turn ends
at a tool call (the tool runs and its output is appended) or, without one, ends the trajectory: that last turn
holds the final answer. `max_turns` caps the turns; a trajectory still calling tools then has no answer.

TRL's GRPO then does what Flow-GRPO asks, with trajectory-level groups: the final answer is scored once
(the reward functions see the final turn only, never the observations), the reward is normalised over the G
trajectories of a prompt (one member each, whatever their number of turns), and that advantage multiplies
the log-probabilities of every policy token of every turn (grpo_exp.rollout.flow has these as pure functions).
Observation tokens are masked out of the loss (TRL's env_mask); with beta > 0 the KL to TRL's frozen
reference model is taken on the same policy tokens.
"""

import contextlib
import functools
import logging
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList
from trl.trainer.utils import is_async_callable

from grpo_exp.config_rules import OnlyWith
from grpo_exp.data_parallel import process_layout
from grpo_exp.generation import left_padded_eval, prompt_ids
from grpo_exp.rollout.environment import (
    Episode,
    check_environment_column,
    episode_budget,
    load_environments,
    new_episodes,
    spend_failures,
)
from grpo_exp.rollout.tools import Tool, build_tools, first_call, tools_message
from grpo_exp.rollout.tools.python_sandbox import SandboxLimits
from grpo_exp.rollout.turn_cache import after_turn, first_turn, next_turn, turns_cacheable
from grpo_exp.rollout.vllm_turns import TurnSampling
from grpo_exp.sampled_log_probs import SampledLogProbs
from grpo_exp.schema import RolloutName

log = logging.getLogger(__name__)

# Per-trajectory fields handed to TRL (and on to the reward functions and grpo_exp's statistics).
TRAJECTORY_FIELDS = (
    "final_turn",
    "num_turns",
    "tool_calls",
    "tool_errors",
    "ended",
    "cut",  # its last turn was cut at rollout.max_tokens_per_turn (neither an end nor a tool call)
    "environment",  # rollout=environment: the episode's environment, its get_reward() and why it failed
    "env_reward",
    "env_success",
    "env_failure",
    "turn_rewards",  # each turn's step reward (the environment's step_rewards; 0.0 elsewhere)
    "turn_tokens",  # each turn's number of policy tokens (which completion tokens belong to which turn)
)


NO_EPISODE = {"environment": None, "env_reward": None, "env_success": None, "env_failure": None}


@dataclass
class Trajectory:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1: the policy's token, 0: a tool's observation
    # the sampler's log-probability of each completion token (0.0 for observations), where asked for
    logprobs: list[float] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # the policy's text, turn by turn
    turn_rewards: list[float] = field(default_factory=list)  # what each turn's step earned (step_rewards)
    turn_tokens: list[int] = field(default_factory=list)  # each turn's number of policy tokens
    observations: list[str] = field(default_factory=list)  # what the tools answered, call by call
    tool_calls: int = 0
    tool_errors: int = 0
    ended: bool = False  # by a turn without a tool call (not by max_turns)
    cut: bool = False  # its last turn stopped at rollout.max_tokens_per_turn, with neither an EOS nor a tool call
    done: bool = False
    tools: list[Tool] = field(default_factory=list)  # what this trajectory can call
    episode: Episode | None = None  # rollout=environment: its environment's instance

    @property
    def final_turn(self) -> str:
        """The text that holds the final answer: the last turn, when it called no tool."""
        return self.turns[-1] if self.ended else ""

    def fields(self) -> dict:
        return {
            "final_turn": self.final_turn,
            "num_turns": len(self.turns),
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "ended": self.ended,
            "cut": self.cut,
            **(NO_EPISODE if self.episode is None else self.episode.fields()),
            "turn_rewards": list(self.turn_rewards),
            "turn_tokens": list(self.turn_tokens),
        }


class StopAtToolCall(StoppingCriteria):
    """Ends a sequence's turn as soon as its new text holds a complete tool call."""

    def __init__(self, tokenizer, tools: list[list[Tool]], prompt_length: int):
        """`tools`: each row's."""
        self.tokenizer, self.tools, self.prompt_length = tokenizer, tools, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_length :], skip_special_tokens=True)
        calls = [first_call(text, tools) is not None for text, tools in zip(texts, self.tools, strict=True)]
        return torch.tensor(calls, device=input_ids.device)


class MultiTurnRollout:
    """The rollout engine: TRL's `rollout_func` in training, and greedy trajectories for evaluation."""

    def __init__(self, rollout_cfg: DictConfig):
        self.cfg = rollout_cfg
        limits = SandboxLimits(**OmegaConf.to_container(rollout_cfg.python))
        self.tools = build_tools(list(rollout_cfg.tools), limits)
        setting = rollout_cfg.get("environment")
        timeout = rollout_cfg.environment_timeout_s
        self.environments = {} if setting is None else load_environments(setting, timeout, rollout_cfg)
        names = [env.name for env in self.environments.values()]
        self.budget = episode_budget(rollout_cfg, names) if self.environments else None
        self._told_uncached = False

    def check_rows(self, dataset, split: str) -> None:
        """With several environments, every row of `dataset` names one (before any model loads)."""
        if self.environments:
            check_environment_column(dataset.to_list(), self.environments, split)

    def messages(
        self, prompt: list[dict], tools: list[Tool] | None = None, observation: str | None = None
    ) -> list[dict]:
        """The task's chat prompt after the tools' system message and demonstration exchange. The system message
        is rollout.system, then (rollout.describe_tools) what the user's own tools (`tools`: the trajectory's; else
        rollout.tools) do and how they are called. `observation`: the environment's reset text, after the last user
        message's."""
        parts = [self.cfg.system] if self.cfg.system else []
        tools = self.tools if tools is None else tools
        described = tools_message(tools) if self.cfg.get("describe_tools", True) else None
        if described:
            parts.append(described)
        if prompt and prompt[0]["role"] == "system":  # the dataset's own system message joins ours
            parts.append(prompt[0]["content"])
            prompt = prompt[1:]
        system = [{"role": "system", "content": "\n\n".join(parts)}] if parts else []
        demo = OmegaConf.to_container(self.cfg.demo) if self.cfg.demo else []
        prompt = list(prompt)
        if observation:
            prompt[-1] = {**prompt[-1], "content": f"{prompt[-1]['content']}\n\n{observation}"}
        return system + demo + prompt

    def run(
        self,
        model,
        tokenizer,
        prompts: list,
        generation: dict,
        batch_size: int,
        desc: str | None = None,
        log_probs_at: float | None = None,
        rows: list[dict] | None = None,
        engine=None,
    ) -> list[Trajectory]:
        """Play every prompt out, batching the trajectories still going at each turn. `log_probs_at` (a
        temperature): also record the sampler's log-probability of each policy token (grpo_exp.sampled_log_probs).
        `rows`: each prompt's dataset row, which its environment's reset receives (rollout=environment).
        `engine`: a vLLM engine (grpo_exp.rollout.vllm_turns) generates the turns, not `model`."""
        trajectories = [
            self._start(tokenizer, prompt, row)
            for prompt, row in zip(prompts, rows or [{}] * len(prompts), strict=True)
        ]
        if engine is not None:
            self._play_on_engine(engine, tokenizer, trajectories, generation, desc, log_probs_at)
            return self._finished(trajectories)
        cached = self.cfg.get("cache_turns", True)
        uncacheable = turns_cacheable(model.config) if cached else None
        if uncacheable is not None and not self._told_uncached:
            log.info("Multi-turn: every turn prefills its whole context again, as %s", uncacheable)
            self._told_uncached = True
        play = self._play_cached if cached and uncacheable is None else self._play_each_turn_whole
        with left_padded_eval(model, tokenizer), torch.no_grad():
            play(model, tokenizer, trajectories, generation, batch_size, desc, log_probs_at)
        return self._finished(trajectories)

    @staticmethod
    def _finished(trajectories: list["Trajectory"]) -> list["Trajectory"]:
        for trajectory in trajectories:
            if trajectory.episode is not None:
                trajectory.episode.finish()
        return trajectories

    def _play_on_engine(self, engine, tokenizer, trajectories, generation, desc, log_probs_at) -> None:
        """Every trajectory played out on a vLLM engine (grpo_exp.rollout.vllm_turns): each turn submitted as soon as
        the trajectory is ready for it, the engine batching whatever is in flight. A turn ends at EOS, at a tool
        call's closing text (the trajectory's tools' stop strings) or at max_tokens_per_turn, and is cut where its
        first call completes, as on generate()."""
        eos, last = _eos_ids(tokenizer), self.cfg.max_turns - 1
        temperature = generation.get("temperature") if generation.get("do_sample", True) else 0.0
        top_p = generation.get("top_p") or 1.0
        samplings = [
            TurnSampling(
                temperature=float(temperature or 0.0),
                top_p=float(top_p),
                max_tokens=self.cfg.max_tokens_per_turn,
                stop=tuple(sorted({tool.stop for tool in t.tools if tool.stop})),
                log_probs=log_probs_at is not None,
            )
            for t in trajectories
        ]
        for key, trajectory in enumerate(trajectories):
            engine.submit(key, trajectory.prompt_ids, samplings[key])
        with tqdm(total=len(trajectories), desc=desc, unit="trajectory", disable=desc is None) as progress:
            while engine.busy():
                for turn in engine.finished():
                    trajectory = trajectories[turn.key]
                    ids = self._turn_tokens(turn.token_ids, eos, tokenizer, trajectory.tools)
                    log_probs = None if turn.log_probs is None else turn.log_probs[: len(ids)]
                    self._advance(trajectory, ids, tokenizer, len(trajectory.turns) == last, log_probs)
                    if trajectory.done:
                        progress.update()
                    else:
                        context = trajectory.prompt_ids + trajectory.completion_ids
                        engine.submit(turn.key, context, samplings[turn.key])

    def _play_cached(self, model, tokenizer, trajectories, generation, batch_size, desc, log_probs_at) -> None:
        """Each batch of trajectories played out turn by turn, its KV cache kept between turns
        (grpo_exp.rollout.turn_cache): a turn prefills only the observations."""
        eos, pad, turns = _eos_ids(tokenizer), tokenizer.pad_token_id, self.cfg.max_turns
        batches = [trajectories[start : start + batch_size] for start in range(0, len(trajectories), batch_size)]
        with tqdm(total=len(batches) * turns, desc=desc, unit="turn", disable=desc is None) as progress:
            for active in batches:
                batch = first_turn(model, [t.prompt_ids for t in active], pad, uniform=process_layout()[1] > 1)
                for turn in range(turns):
                    inputs = batch.generate_inputs(model)
                    output, ids, log_probs = self._generate(
                        model, tokenizer, inputs, [t.tools for t in active], generation, eos, log_probs_at
                    )
                    observations = [
                        self._advance(trajectory, turn_ids, tokenizer, turn == turns - 1, logps)
                        for trajectory, turn_ids, logps in zip(active, ids, log_probs, strict=True)
                    ]
                    progress.update()
                    going = [i for i, t in enumerate(active) if not t.done]
                    if not going:
                        progress.update(turns - turn - 1)
                        break
                    batch = after_turn(batch, output, [len(turn_ids) for turn_ids in ids])
                    batch = next_turn(batch, going, [observations[i] for i in going], pad)
                    active = [active[i] for i in going]

    def _play_each_turn_whole(self, model, tokenizer, trajectories, generation, batch_size, desc, log_probs_at) -> None:
        """Every turn generated from the whole context, prefilled again (models whose turns cannot be cached)."""
        eos = _eos_ids(tokenizer)
        for turn in tqdm(range(self.cfg.max_turns), desc=desc, unit="turn", disable=desc is None):
            active = [t for t in trajectories if not t.done]
            if not active:
                break
            for start in range(0, len(active), batch_size):
                batch = active[start : start + batch_size]
                contexts = [t.prompt_ids + t.completion_ids for t in batch]
                inputs = tokenizer.pad({"input_ids": contexts}, return_tensors="pt").to(model.device)
                _, turns, log_probs = self._generate(
                    model, tokenizer, dict(inputs), [t.tools for t in batch], generation, eos, log_probs_at
                )
                for trajectory, ids, logps in zip(batch, turns, log_probs, strict=True):
                    self._advance(trajectory, ids, tokenizer, turn == self.cfg.max_turns - 1, logps)

    def _start(self, tokenizer, prompt: list[dict], row: dict) -> Trajectory:
        """A trajectory, with its environment's episode started (reset) where the run has environments."""
        episode, observation = None, None
        if self.environments:
            cfg = self.cfg
            (episode,) = new_episodes(self.environments, [row], cfg.environment_timeout_s, cfg.environment_success_at)
            observation = episode.start(row)
        tools = self.tools + ([] if episode is None else episode.tools)
        return Trajectory(
            prompt_ids(tokenizer, self.messages(prompt, tools, observation)), tools=tools, episode=episode
        )

    def _generate(
        self,
        model,
        tokenizer,
        inputs: dict,
        tools: list[list[Tool]],
        generation: dict,
        eos: set[int],
        log_probs_at: float | None,
    ) -> tuple[torch.Tensor, list[list[int]], list[list[float]] | list[None]]:
        """generate()'s output for `inputs` (input_ids, attention_mask and, cached, the KV cache), each row's next
        turn as cut, and (log_probs_at) the sampler's log-probability of each of its tokens."""
        length = inputs["input_ids"].shape[1]
        record = None if log_probs_at is None else SampledLogProbs(model, log_probs_at)
        with record or contextlib.nullcontext():
            output = model.generate(
                **inputs,
                **(generation | {"max_new_tokens": self.cfg.max_tokens_per_turn}),
                stopping_criteria=StoppingCriteriaList([StopAtToolCall(tokenizer, tools, length)]),
            )
        turns = [
            self._turn_tokens(row[length:].tolist(), eos, tokenizer, own)
            for row, own in zip(output, tools, strict=True)
        ]
        if record is None:
            return output, turns, [None] * len(turns)
        log_probs = record.of(output[:, length:])
        return output, turns, [row[: len(ids)].tolist() for row, ids in zip(log_probs, turns, strict=True)]

    def _turn_tokens(self, ids: list[int], eos: set[int], tokenizer, tools: list[Tool]) -> list[int]:
        """The tokens the policy generated in a turn, without the padding that follows its end.

        A turn ends at its EOS or where its tool call completes. The padding after a stopped row is often the
        EOS token itself (SmolLM2's pad is its EOS), so a turn that stopped at a call is cut where the call
        completes: training on a padding EOS the policy never sampled would teach it to end the conversation.
        """
        end = next((i + 1 for i, token in enumerate(ids) if token in eos), len(ids))
        while end and ids[end - 1] == tokenizer.pad_token_id and ids[end - 1] not in eos:
            end -= 1
        ids = ids[:end]
        if first_call(tokenizer.decode(ids, skip_special_tokens=True), tools) is None:
            return ids
        return next(
            ids[:n]
            for n in range(1, len(ids) + 1)
            if first_call(tokenizer.decode(ids[:n], skip_special_tokens=True), tools)
        )

    def _advance(
        self, trajectory: Trajectory, ids: list[int], tokenizer, last_turn: bool, log_probs: list[float] | None = None
    ) -> list[int]:
        """The turn `ids` added to the trajectory, its tool run; the observation's tokens the trajectory reads next
        ([] where it is done)."""
        text = tokenizer.decode(ids, skip_special_tokens=True)
        trajectory.completion_ids += ids
        trajectory.env_mask += [1] * len(ids)
        trajectory.logprobs += log_probs or []
        trajectory.turns.append(text)
        trajectory.turn_tokens.append(len(ids))
        trajectory.turn_rewards.append(0.0)
        call = first_call(text, trajectory.tools)
        if call is None:
            trajectory.ended = trajectory.done = True
            trajectory.cut = bool(ids) and ids[-1] not in _eos_ids(tokenizer)
            return []
        result = call.tool.run(call.argument)
        trajectory.tool_calls += 1
        trajectory.tool_errors += result.error
        episode = trajectory.episode
        if episode is not None:
            trajectory.turn_rewards[-1] = episode.take_step_reward()
        if last_turn or (episode is not None and episode.failure is not None):  # no turn left to read it
            trajectory.done = True
            return []
        output = result.output[: self.cfg.max_observation_chars]
        trajectory.observations.append(call.tool.observation.format(output=output))
        observation = tokenizer(trajectory.observations[-1], add_special_tokens=False)["input_ids"]
        trajectory.completion_ids += observation
        trajectory.env_mask += [0] * len(observation)
        trajectory.logprobs += [0.0] * len(observation)  # not the policy's: masked out of the loss and the metrics
        return observation

    def trl_batch(
        self,
        model,
        tokenizer,
        prompts: list,
        generation_kwargs: dict,
        log_probs_at: float | None = None,
        rows: list[dict] | None = None,
        engine=None,
    ) -> dict:
        """What TRL's rollout_func returns (grpo_exp.trainer.trl_batch.RolloutFunc): this process's prompts, one
        per trajectory (groups already repeated), and their dataset rows; with the sampler's log-probabilities where
        `log_probs_at`. Failed episodes are spent from the failure budget (every process together)."""
        trajectories = self.run(
            model,
            tokenizer,
            prompts,
            generation_kwargs,
            len(prompts),
            log_probs_at=log_probs_at,
            rows=rows,
            engine=engine,
        )
        return self.batch_of(trajectories, log_probs_at)

    def batch_of(self, trajectories: list[Trajectory], log_probs_at: float | None) -> dict:
        """TRL's rollout_func output of trajectories played (trl_batch; or ahead of their step, on a server:
        grpo_exp.trainer.async_generation), their failed episodes spent from the failure budget: a collective, on
        the trainer's thread."""
        if self.budget is not None:
            spend_failures([t.episode for t in trajectories], self.budget)
        fields = [t.fields() for t in trajectories]
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": None if log_probs_at is None else [t.logprobs for t in trajectories],
            "env_mask": [t.env_mask for t in trajectories],
            **{key: [f[key] for f in fields] for key in TRAJECTORY_FIELDS},
        }


def _eos_ids(tokenizer) -> set[int]:
    eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos}


def scored_on_final_turn(reward_func):
    """A reward function that sees each trajectory's final turn as the completion (never the tools' output), called
    as TRL calls it (every argument by name; an async one, such as the judge's, stays async for TRL to await)."""

    def final_turns(final_turn: list[str]) -> list[list[dict]]:
        return [[{"role": "assistant", "content": text}] for text in final_turn]

    if is_async_callable(reward_func):

        @functools.wraps(reward_func)
        async def on_final_turn_async(completions, final_turn, **kwargs):
            return await reward_func(completions=final_turns(final_turn), **kwargs)

        return on_final_turn_async

    @functools.wraps(reward_func)
    def on_final_turn(completions, final_turn, **kwargs):
        return reward_func(completions=final_turns(final_turn), **kwargs)

    return on_final_turn


def greedy_generation(tokenizer) -> dict:
    return {
        "do_sample": False,
        "pad_token_id": tokenizer.pad_token_id,
        "temperature": None,
        "top_p": None,
        "top_k": None,
    }


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("rollout",),
        lambda cfg: cfg.rollout.name is RolloutName.multiturn,
        "by the multi-turn rollout (rollout=multiturn)",
        lambda cfg: f"this run has rollout={cfg.rollout.name.value}",
        "add rollout=multiturn",
        but=("rollout.name",),
    ),
)
