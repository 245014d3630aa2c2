"""The user's environment class in TRL's own convention (GRPOTrainer's environment_factory), run through grpo_exp's
multi-turn loop, so on any chat template (rollout=multiturn rollout.environment=module:Class):

- one instance per trajectory, made by calling the class (or any factory) with no argument;
- reset(**row) -> str | None: the row's question and solution (and a reasoning-gym row's task fields); its text
  joins the prompt's last user message;
- its public methods are the tools, called with grpo_exp's plain tags (`<guess>7</guess>`, several arguments as a
  JSON object) and described in the system message from their docstrings and type hints (grpo_exp.rollout.tools.user);
- get_reward() -> float, where it has one: the `environment` reward component (reward=environment, mixed and weighted
  like any other), read once the trajectory has ended: the episode's whole return;
- step_rewards, where it keeps one: a list to which its methods append what each step earned, the parts of
  get_reward()'s return step by step (an attribute, so that it is no tool on TRL's path either). The trajectory's
  turns carry them (`turn_rewards`), and rollout.turn_credit=discounted_return credits each turn with its
  discounted return (grpo_exp.rollout.flow); the default credits the whole outcome to every turn (Flow-GRPO).

Several environments share a run as TRL's dict form does: rollout.environment={name: module:Class}, each row choosing
by its `environment` column.

Faults cost an episode, never the run. A method that raises is an observation `error: ...` the policy reads, as any
tool's error is. A call to the environment (making it, reset, a method, get_reward) that runs past
rollout.environment_timeout_s, or that returns nonsense (reset: not text; get_reward: not a finite number), or a
reset / get_reward that raises, fails the episode (each call runs in a thread of its own, so that a hung one can be
abandoned): it ends, its environment reward is missing (left out of its group's statistics and imputed like any
failed reward), and it is counted (environment/failures). Past
rollout.environment_max_failure_rate of the episodes of the last rollout.environment_failure_window steps, every
process's together, the run stops naming the environment (grpo_exp.failure_budget).
"""

import dataclasses
import inspect
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_exp.config_rules import OnlyWith
from grpo_exp.environments.schemes import build_scheme, builtin_schemes, scheme_of
from grpo_exp.errors import UserError
from grpo_exp.failure_budget import FailureBudget
from grpo_exp.plugins import import_callable
from grpo_exp.rollout.tools import TOOLS, Tool, user_tool
from grpo_exp.rollout.tools.result import ToolResult
from grpo_exp.rollout.tools.user import UserTool, checked_user_tool, tool_name

KEY = "rollout.environment"
CONVENTION = (
    "an environment is a class (or a factory) called with no argument, whose instance has reset(**row) -> str | None, "
    "public methods with type hints and docstrings as its tools, and optionally get_reward() -> float (TRL's "
    "environment_factory convention)"
)
NOT_TOOLS = ("reset", "get_reward")
log = logging.getLogger(__name__)
STEP_REWARDS = "step_rewards"  # the attribute an environment keeps its per-step rewards in
ROW_FIELDS = ("question", "solution", "task_name", "task_level", "task_entry")  # what reset(**row) receives


class EnvironmentTimeout(Exception):
    pass


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """call() in a thread of its own, its result or its exception; EnvironmentTimeout past `seconds` (the thread is
    left to finish on its own: Python cannot stop it, and the episode holding it is abandoned)."""
    outcome: dict[str, Any] = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the caller as it is
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True, name="grpo_exp-environment")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise EnvironmentTimeout(f"ran past rollout.environment_timeout_s={seconds:g}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@dataclass(frozen=True)
class Environment:
    """One environment of the run, checked: its name (the dict's key, else its class's name), how it is made, and
    whether it scores its episodes."""

    name: str
    path: str
    factory: Callable[[], Any]
    has_reward: bool
    tools: tuple[UserTool, ...]  # its methods, checked once on the first instance; each episode binds its own

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.tools)


def public_methods(instance) -> list[tuple[str, Callable]]:
    """The instance's tools as TRL finds them: the functions of its class not starting with _, but reset and
    get_reward, bound to it (listed on the class, so that no property is evaluated)."""
    return [
        (name, getattr(instance, name))
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def method_tools(instance, path: str, where: str) -> list[UserTool]:
    return [
        checked_user_tool(method, name, f"{path}.{name}", f"{where}: its method {name}")
        for name, method in public_methods(instance)
    ]


def load_environment(
    name: str | None, path: str, where: str, timeout: float, rollout_settings: Mapping | None = None
) -> Environment:
    """The environment at `path` (`where`: the config key), made once and checked: reset, its methods as tools.
    A built-in scheme's (`textarena/<game id>`, `openenv/<url>`: grpo_exp.environments) is built with the rollout
    settings it declares as its own, read from `rollout_settings` (the rollout config)."""
    scheme = scheme_of(path)
    if scheme is not None:
        factory = build_scheme(scheme, path.removeprefix(scheme), rollout_settings)
        name = name or factory.__name__
    elif ":" not in path:  # neither a built-in's scheme nor an import path: say what each would be
        built_in = ", ".join(f"{prefix}..." for prefix in builtin_schemes())
        raise UserError(
            f"{where}: neither a built-in environment ({built_in}) nor your class by import path, module:Class"
        )
    else:
        factory = import_callable(path, where.partition("=")[0], "an environment class")
    try:
        instance = within(timeout, factory)
    except Exception as err:  # noqa: BLE001 - the user's constructor: its error, in one line
        raise UserError(f"{where}: making an instance raised {type(err).__name__}: {err}") from None
    if not callable(getattr(instance, "reset", None)):
        raise UserError(f"{where}: its instance has no reset(); {CONVENTION}")
    tools = method_tools(instance, path, where)
    has_reward = callable(getattr(instance, "get_reward", None))
    if inspect.iscoroutinefunction(getattr(instance, "get_reward", None)):
        raise UserError(f"{where}: get_reward is async; grpo_exp's loop calls it directly: make it a plain method")
    if not tools and not has_reward:
        raise UserError(f"{where}: no public method (no tool) and no get_reward: nothing to act with or to score")
    return Environment(name or type(instance).__name__, path, factory, has_reward, tuple(tools))


def load_environments(
    setting, timeout: float, rollout_settings: Mapping | None = None
) -> dict[str | None, Environment]:
    """rollout.environment: one import path (every row; key None), or {name: import path} (by the rows'
    `environment` column). Checked at resolve time, before any model loads. `rollout_settings`: the rollout config,
    whose settings a built-in scheme declares as its own are passed to its builder."""
    if isinstance(setting, str):
        return {None: load_environment(None, setting, f"{KEY}={setting}", timeout, rollout_settings)}
    if not hasattr(setting, "items") or not setting:
        raise UserError(f"{KEY}={setting!r}: an import path (module:Class) or a mapping {{name: module:Class}}")
    environments = {}
    for name, path in setting.items():
        if not isinstance(path, str):
            raise UserError(f"{KEY}.{name}={path!r}: an import path, module:Class")
        where = f"{KEY}.{name}={path}"
        environments[str(name)] = load_environment(str(name), path, where, timeout, rollout_settings)
    return environments


def check_environment_column(rows: list[dict], environments: dict[str | None, Environment], split: str) -> None:
    """With several environments every row names one of them in its `environment` column (UserError otherwise,
    before any model loads: every process sees the same rows)."""
    if None in environments:
        return
    unknown = sorted({str(row.get("environment")) for row in rows if row.get("environment") not in environments})
    if unknown:
        raise UserError(
            f"{KEY} has the environments {sorted(environments)}, but {split} rows name {unknown[:5]} in their "
            "`environment` column (or have none): each row chooses one by name"
        )


@dataclass
class Episode:
    """One trajectory's instance of its environment, and what became of it."""

    environment: Environment
    timeout: float
    success_at: float = 1.0  # a reward at least this is a success (rollout.environment_success_at)
    instance: Any = None
    tools: list[Tool] = field(default_factory=list)
    failure: str | None = None  # why the episode failed; None while it has not
    reward: float | None = None
    step_rewards_taken: int = 0  # how many of the instance's step_rewards the trajectory's turns have taken
    finished: bool = False  # get_reward() read (or not to be read)

    @property
    def success(self) -> bool:
        return self.reward is not None and self.reward >= self.success_at

    def fields(self) -> dict:
        """What the trajectory reports of its episode (grpo_exp.rollout.multiturn.TRAJECTORY_FIELDS)."""
        return {
            "environment": self.environment.name,
            "env_reward": self.reward,
            "env_success": self.success,
            "env_failure": self.failure,
        }

    def fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = f"environment {self.environment.name}: {why}"

    def start(self, row: dict) -> str | None:
        """A new instance, reset with the row's fields: the text that joins the prompt (None: nothing)."""
        try:
            self.instance = within(self.timeout, self.environment.factory)
            observation = within(self.timeout, lambda: self.instance.reset(**reset_kwargs(row)))
        except Exception as err:  # noqa: BLE001 - the user's environment: the episode fails, the run goes on
            self.fail(
                f"reset raised {type(err).__name__}: {err}"
                if not isinstance(err, EnvironmentTimeout)
                else f"reset {err}"
            )
            return None
        if observation is not None and not isinstance(observation, str):
            self.fail(f"reset returned a {type(observation).__name__}, not text or None")
            return None
        # the checked methods, bound to this instance (checking them again for every episode would parse each
        # docstring and type hint once per trajectory)
        bound = [dataclasses.replace(tool, func=getattr(self.instance, tool.name)) for tool in self.environment.tools]
        self.tools = [self._timed(tool) for tool in bound]
        kept = self._step_rewards()
        self.step_rewards_taken = len(kept) if isinstance(kept, list) else 0
        return observation

    def call(self, name: str, arguments: dict) -> Any:
        """The method `name` with TRL's parsed arguments (rollout.tool_calling=native), within the time limit: its
        exception goes on to TRL, which shows it to the policy as an error; past the time limit the episode fails.
        A failed episode's instance is not called again."""
        if self.failure is not None:
            return f"error: the episode failed ({self.failure})"
        try:
            return within(self.timeout, lambda: getattr(self.instance, name)(**arguments))
        except EnvironmentTimeout as err:
            self.fail(f"{name} {err}")
            return f"error: {name} timed out"

    def _step_rewards(self) -> list:
        kept = getattr(self.instance, STEP_REWARDS, None)
        return [] if kept is None else kept

    def take_step_reward(self) -> float:
        """What the steps since the last call earned (the sum of the step_rewards appended since): 0.0 where the
        environment keeps none; a failed episode's are 0.0. A step_rewards that is not a list of finite numbers,
        or one kept by an environment without get_reward() (whose return they would be parts of), fails it."""
        kept = self._step_rewards()
        if self.failure is not None or (isinstance(kept, list) and not kept):
            return 0.0
        if not self.environment.has_reward:
            self.fail(f"keeps {STEP_REWARDS} but has no get_reward(): get_reward() is the return they are parts of")
            return 0.0
        if not isinstance(kept, list) or not all(is_number(value) for value in kept):
            self.fail(f"{STEP_REWARDS} is {kept!r:.80}, not a list of finite numbers")
            return 0.0
        new, self.step_rewards_taken = kept[self.step_rewards_taken :], len(kept)
        return float(sum(new))

    def _timed(self, tool: UserTool) -> Tool:
        """The method as a tool whose call fails the episode when it runs past the time limit."""

        def run(text: str) -> ToolResult:
            try:
                return within(self.timeout, lambda: tool.run(text))
            except EnvironmentTimeout as err:
                self.fail(f"{tool.name} {err}")
                return ToolResult(f"error: {tool.name} timed out", True)

        return dataclasses.replace(user_tool(tool), run=run)

    def finish(self) -> None:
        """get_reward(), where the environment has one and the episode has not failed (once: later calls keep it)."""
        if self.finished:
            return
        self.finished = True
        if self.failure is not None or not self.environment.has_reward:
            return
        try:
            value = within(self.timeout, self.instance.get_reward)
        except Exception as err:  # noqa: BLE001 - the user's environment: the episode fails, the run goes on
            self.fail(
                f"get_reward {err}"
                if isinstance(err, EnvironmentTimeout)
                else f"get_reward raised {type(err).__name__}: {err}"
            )
            return
        if not is_number(value):
            self.fail(f"get_reward returned {value!r}, not a finite number")
            return
        self.reward = float(value)


def is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def reset_kwargs(row: dict) -> dict:
    return {key: row[key] for key in ROW_FIELDS if row.get(key) is not None}


def new_episodes(
    environments: dict[str | None, Environment], rows: list[dict], timeout: float, success_at: float = 1.0
) -> list[Episode]:
    """One episode per row, of the environment its row names (or the only one)."""
    single = environments.get(None)
    return [Episode(single or environments[row.get("environment")], timeout, success_at) for row in rows]


# ---- statistics (pure) -------------------------------------------------------------------------------------------


def environment_statistics(records: list[dict], prefix: str = "environment") -> dict[str, float]:
    """Per environment, over its episodes (records with `environment`, `env_reward`, `env_success`, `env_failure`):
    the mean reward of those scored, the success rate (a failed episode did not succeed) and the failed share; and
    the failed share and the success rate over all."""
    episodes = [r for r in records if r.get("environment") is not None]
    if not episodes:
        return {}
    stats = {
        f"{prefix}/failures": sum(r["env_failure"] is not None for r in episodes) / len(episodes),
        f"{prefix}/success": sum(bool(r["env_success"]) for r in episodes) / len(episodes),  # every environment's
    }
    for name in sorted({r["environment"] for r in episodes}):
        own = [r for r in episodes if r["environment"] == name]
        scored = [r["env_reward"] for r in own if r["env_reward"] is not None]
        stats[f"{prefix}/{name}/failures"] = sum(r["env_failure"] is not None for r in own) / len(own)
        if scored:
            stats[f"{prefix}/{name}/reward_mean"] = sum(scored) / len(scored)
            stats[f"{prefix}/{name}/success"] = sum(bool(r["env_success"]) for r in own) / len(own)
    return stats


def spend_failures(episodes: list[Episode], budget: FailureBudget) -> None:
    """A batch's failed episodes, each reason logged once, spent from the failure budget (a collective: every
    process calls this at the same point of each step, on either loop)."""
    failures = [episode.failure for episode in episodes if episode.failure is not None]
    for failure in sorted(set(failures)):
        log.warning("Episode failed: %s", failure)
    budget.spend(len(failures), len(episodes))


def episode_budget(rollout_cfg, names: list[str]) -> FailureBudget:
    """rollout.environment_max_failure_rate over the last rollout.environment_failure_window steps."""
    rate = rollout_cfg.environment_max_failure_rate

    def describe(failed: float, total: float, steps: int) -> str:
        return (
            f"the environment(s) {', '.join(names)} ({KEY}) failed {failed:.0f} of {total:.0f} episodes over the "
            f"last {steps} step(s), more than rollout.environment_max_failure_rate={rate} (environment/failures, "
            "and the train log, say why); rollout.environment_max_failure_rate=1.0 never stops"
        )

    return FailureBudget(rate, rollout_cfg.environment_failure_window, describe)


def check_environments(environments: dict, mix: list[str], tools: list) -> None:
    """Their rewards used by the reward mix (its components' names), and their tools' names free of `tools`'
    (rollout.tools)."""
    scored = [env.name for env in environments.values() if env.has_reward]
    if scored and "environment" not in mix:
        joined = "+".join(mix)
        raise UserError(
            f"rollout.environment: {', '.join(scored)} score(s) episodes with get_reward(), but reward={joined} does "
            f"not use it: add it to the mix (reward={joined}+environment, or reward=environment)"
        )
    unscored = [env.name for env in environments.values() if not env.has_reward]
    if unscored and "environment" in mix:
        raise UserError(
            f"reward=...environment: {', '.join(unscored)} has no get_reward() to score its episodes with; give it "
            "one, or leave environment out of the reward mix"
        )
    taken = {tool_name(entry) for entry in tools} | set(TOOLS)
    for env in environments.values():
        clash = sorted(taken & set(env.tool_names))
        if clash:
            raise UserError(
                f"rollout.environment: {env.name}'s method {clash[0]} has the name of a tool of rollout.tools: rename "
                "one of them (a call is <name>...</name>)"
            )


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        (
            "rollout.environment_timeout_s",
            "rollout.environment_success_at",
            "rollout.environment_max_failure_rate",
            "rollout.environment_failure_window",
            "rollout.tool_calling",
        ),
        lambda cfg: cfg.rollout.environment is not None,
        "by an environment (rollout=environment)",
        lambda cfg: "rollout.environment=null has none",
        "set rollout=environment rollout.environment=module:Class",
    ),
)
