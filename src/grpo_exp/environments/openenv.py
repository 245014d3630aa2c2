"""An OpenEnv environment served over HTTP (`openenv-core`'s server, anywhere: a local process, a Docker container, a
Space) as an environment in TRL's convention: rollout.environment=openenv/<base url>, e.g.

    python -m grpo_exp.train rollout=environment reward=environment rollout.environment=openenv/http://127.0.0.1:8000

Each episode is one session of the server (OpenEnv's own client, `GenericEnvClient`, over its WebSocket):
- reset: a new session, reset with the row's answer as its seed where that is a whole number (seeded rows, as
  grpo_exp.environments.textarena's `episodes` makes); the observation's text joins the prompt;
- the tool `step`: the server's action, its fields the tool's arguments (typed and described from the action's JSON
  schema, GET /schema), and the observation's text as the result;
- each step's reward goes to step_rewards (rollout.turn_credit=discounted_return credits each turn with it);
  get_reward() is the episode's return, their sum. Once the server says done, the episode takes no more steps.

The server must accept as many sessions at once as the batch has trajectories (its max_concurrent_envs).
"""

import functools
import inspect
import json
import threading

from grpo_exp.environments.schemes import environment_scheme
from grpo_exp.errors import UserError

PREFIX = "openenv/"
TOOL = "step"
JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}
NOT_ACTION_FIELDS = ("metadata",)
CLOSE_WAIT_S = 5.0  # OpenEnv's Action base class carries it; not the policy's to write


class OpenEnvEpisode:
    """One session of the OpenEnv server at `url` per episode (the subclass made for the server adds `step`)."""

    def __init__(self, url: str):
        self.url, self.client, self.step_rewards, self.done = url, None, [], False

    def reset(self, question: str = "", solution: str | None = None, **row) -> str:
        from openenv.core import GenericEnvClient

        self._close()
        self.client = GenericEnvClient(base_url=self.url).sync()
        seed = str(solution).strip() if solution is not None else ""
        result = self.client.reset(**({"seed": int(seed)} if seed.lstrip("-").isdigit() else {}))
        self.step_rewards, self.done = [], bool(result.done)
        return observation_text(result.observation)

    def _step(self, action: dict) -> str:
        if self.done:
            return "The episode is over."
        result = self.client.step(action)
        self.step_rewards.append(float(result.reward or 0.0))
        self.done = bool(result.done)
        return observation_text(result.observation)

    def get_reward(self) -> float:
        self._close()
        return float(sum(self.step_rewards))

    def _close(self) -> None:
        """Ends the session, waiting CLOSE_WAIT_S at most (a stalled server must not stall training)."""
        if self.client is not None:
            client, self.client = self.client, None
            closing = threading.Thread(target=client.close, daemon=True, name="grpo_exp-openenv-close")
            closing.start()
            closing.join(CLOSE_WAIT_S)

    def __del__(self):  # an episode abandoned before get_reward (failed) still ends its session
        try:
            self._close()
        except Exception:  # noqa: BLE001, S110 - best effort at garbage collection
            pass


def observation_text(observation: dict) -> str:
    """What the policy reads of an observation: its one text field alone, else each field on a line."""
    texts = [value for value in observation.values() if isinstance(value, str) and value]
    if len(texts) == 1 and all(isinstance(v, str) or v in (None, [], {}) for v in observation.values()):
        return texts[0]
    return "\n".join(
        f"{key}: {json.dumps(value) if not isinstance(value, str) else value}" for key, value in observation.items()
    )


def action_tool(action_schema: dict, where: str):
    """The `step` method for the server's action: one typed, described argument per field of its JSON schema."""
    properties = {k: v for k, v in action_schema.get("properties", {}).items() if k not in NOT_ACTION_FIELDS}
    if not properties:
        raise UserError(f"{where}: the server's action has no field to write")
    required = set(action_schema.get("required", []))
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations, lines = {}, []
    for name, spec in properties.items():
        kind = JSON_TYPES.get(spec.get("type"))
        if kind is None:
            raise UserError(
                f"{where}: the action's field {name} is {spec.get('type') or spec}, and grpo_exp writes text, "
                "whole numbers, numbers and booleans"
            )
        default = inspect.Parameter.empty if name in required else spec.get("default")
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind))
        annotations[name] = kind
        lines.append(f"    {name}: {spec.get('description') or spec.get('title') or name}")

    def step(self, **action) -> str:
        return self._step(action)

    title = action_schema.get("description") or action_schema.get("title") or "the action"
    step.__doc__ = f"Take a step in the environment: {title}.\n\nArgs:\n" + "\n".join(lines)
    step.__signature__ = inspect.Signature(parameters, return_annotation=str)
    step.__annotations__ = {**annotations, "return": str}
    return step


@environment_scheme(PREFIX)
def build(url: str) -> functools.partial:
    """rollout.environment=openenv/<url> (an OpenEnv server keeps its own score)."""
    return server(url)


def server(url: str) -> functools.partial:
    """The factory of episodes of the OpenEnv server at `url` (rollout.environment=openenv/<url>), its action read
    from the server once (GET /schema); its name, the server's own (GET /metadata)."""
    where = f"rollout.environment={PREFIX}{url}"
    try:
        import openenv.core  # noqa: F401
        import requests
    except ImportError as err:
        raise UserError(f"{where} needs OpenEnv's client: pip install 'grpo-exp[openenv]' ({err})") from None
    try:
        schema = requests.get(f"{url.rstrip('/')}/schema", timeout=10).json()
        metadata = requests.get(f"{url.rstrip('/')}/metadata", timeout=10).json()
    except (requests.RequestException, ValueError) as err:
        raise UserError(f"{where}: no OpenEnv server answers there ({type(err).__name__}: {err})") from None
    if not isinstance(schema, dict) or not isinstance(schema.get("action"), dict) or not isinstance(metadata, dict):
        raise UserError(f"{where}: the server's /schema and /metadata are not OpenEnv's (no action schema)")
    episode_class = type("OpenEnv", (OpenEnvEpisode,), {TOOL: action_tool(schema["action"], where)})
    factory = functools.partial(episode_class, url.rstrip("/"))
    factory.__name__ = str(metadata.get("name") or url)  # the environment's name in the metrics
    return factory
