"""rollout.tool_calling=native: the run's environments through TRL's own tool-calling loop (GRPOTrainer's
environment_factory), where the model's chat template supports tool calling: the policy calls the methods in the
template's own format (Qwen's <tool_call>{...}</tool_call>, Llama 3.1's JSON...), TRL parses the calls, runs them and
shows their results as tool messages. `auto` takes this path where the template can, else grpo_exp's tags.

The same class as on grpo_exp's loop, with the same guards: TRL is given, per environment, a class whose instance
holds one Episode (grpo_exp.rollout.environment) per trajectory: reset makes the user's instance and resets it, each
method is the user's (same name, signature and docstring, so TRL describes it the same way) called within
rollout.environment_timeout_s, and get_reward is left to the `environment` reward component (TRL would otherwise add
a reward of its own, weighted 1, beside the mix). A fault costs the episode, as on grpo_exp's loop: the seam settles
each batch's episodes (settled_episodes: failures logged, the failure budget spent). reset's text joins the last
user message after a blank line, as on grpo_exp's loop (TRL appends it as it is).
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass

from grpo_exp.failure_budget import FailureBudget
from grpo_exp.rollout.environment import Environment, Episode, spend_failures

WHY_NOT_NATIVE = "{model}'s chat template {why}: use rollout.tool_calling=tags (grpo_exp's loop, any template)"


def why_not_native(tokenizer) -> str | None:
    """Why TRL's tool-calling loop cannot serve this tokenizer's chat template (None: it can). Sets TRL's response
    parser on the tokenizer where TRL knows one."""
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    if not supports_tool_calling(tokenizer):
        return "cannot render a tool-calling conversation (TRL's supports_tool_calling)"
    if not (getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None)):
        try:
            add_response_schema(tokenizer)
        except ValueError:
            return (
                "renders tool calls, but TRL has no parser for them (trl.chat_template_utils.add_response_schema "
                "knows Qwen 2.5/3, Llama 3.1/3.2, GLM-4.5, gpt-oss, Gemma 4, ... templates)"
            )
    if not is_chat_template_prefix_preserving(tokenizer):
        try:  # TRL trains on a prefix-preserving variant of the template, which it knows for some templates only
            get_training_chat_template(tokenizer)
        except ValueError:
            return "is not prefix-preserving, and TRL has no training variant of it (get_training_chat_template)"
    return None


@dataclass(frozen=True)
class Guards:
    """What every guarded class of a run shares (rollout.*): the time limit of a call, the reward that is a
    success, the longest result the policy reads, and the failure budget."""

    timeout: float
    success_at: float
    max_chars: int
    budget: FailureBudget


def guarded_class(environment: Environment, guards: Guards) -> type:
    """The class TRL makes instances of for `environment` (see the module's docstring)."""

    def __init__(self):
        self.episode = None

    def reset(self, **row):
        self.episode = Episode(environment, guards.timeout, guards.success_at)
        observation = self.episode.start(row)
        return None if observation is None else f"\n\n{observation}"  # TRL appends it as it is; grpo_exp's loop too

    members: dict[str, object] = {"__init__": __init__, "reset": reset, "__doc__": environment.path, "_guards": guards}
    for tool in environment.tools:
        members[tool.name] = _guarded_method(tool.name, getattr(tool.func, "__func__", tool.func), guards.max_chars)
    return type(environment.name.replace("-", "_"), (), members)


def _guarded_method(name: str, original: Callable, max_chars: int) -> Callable:
    @functools.wraps(original)  # TRL describes the tool from the user's signature, type hints and docstring
    def method(self, **arguments):
        result = self.episode.call(name, arguments)
        return result[:max_chars] if isinstance(result, str) else result  # rollout.max_observation_chars

    return method


def environment_factories(environments: dict[str | None, Environment], guards: Guards):
    """TRL's environment_factory: one guarded class, or {name: class} for several (rows choose by `environment`)."""
    classes = {name: guarded_class(env, guards) for name, env in environments.items()}
    return classes[None] if None in classes else classes


def settled_episodes(environments: list | None) -> list[Episode] | None:
    """The batch's episodes from TRL's environment instances (None: not guarded ones), each finished (get_reward,
    where the reward has not read it yet); the failed ones logged and spent from the failure budget (every process
    calls this at the same point of each step)."""
    if not environments or not all(getattr(instance, "episode", None) is not None for instance in environments):
        return None
    episodes = [instance.episode for instance in environments]
    for episode in episodes:
        episode.finish()
    spend_failures(episodes, type(environments[0])._guards.budget)
    return episodes


def with_system(dataset, system: str | None):
    """The dataset's chat prompts with rollout.system first (joined to a system message of the dataset's own), as
    grpo_exp's loop shows it: on TRL's loop the prompts are the dataset's."""
    if not system:
        return dataset

    def add(row: dict) -> dict:
        prompt = list(row["prompt"])
        if prompt and prompt[0]["role"] == "system":
            return {"prompt": [{"role": "system", "content": f"{system}\n\n{prompt[0]['content']}"}, *prompt[1:]]}
        return {"prompt": [{"role": "system", "content": system}, *prompt]}

    return dataset.map(add)
