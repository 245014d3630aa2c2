"""rollout.tool_calling=native: the same environment class through TRL's own tool-calling loop (environment_factory),
where the chat template supports tool calling; auto choosing; the refusals saying why; the guards (a method past its
time limit, a raising reset) as on grpo_exp's loop; and a tiny model taught to call the tool training through TRL's
loop, the user's method really called."""

import sys
import time

import pytest
from transformers.utils import get_json_schema

from grpo_exp.errors import UserError
from grpo_exp.failure_budget import FailureBudget
from grpo_exp.models import load_tokenizer
from grpo_exp.rollout.environment import load_environments
from grpo_exp.rollout.native import Guards, guarded_class, settled_episodes, why_not_native, with_system
from grpo_exp.run.resolve import resolve
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_command
from tests.helpers.episodes import trained_steps, write_user_module
from tests.helpers.tool_calling_model import QWEN3_TEMPLATE, taught_tool_caller

ENVIRONMENTS = '''
import time


class Stepped:
    """Find the secret digit."""

    def reset(self, question, solution, **row):
        self.secret, self.step_rewards = int(solution) % 10, []
        return "A secret digit from 0 to 9."

    def probe(self, digit: int) -> str:
        """Whether the secret is this digit.

        Args:
            digit: the digit
        """
        self.step_rewards.append(1.0 if digit == self.secret else -0.25)
        return "right" if digit == self.secret else "wrong"

    def get_reward(self) -> float:
        return sum(self.step_rewards)


class Slow(Stepped):
    def probe(self, digit: int) -> str:
        """Sleeps.

        Args:
            digit: the digit
        """
        time.sleep(30)
        return "late"


class Broken(Stepped):
    def reset(self, question, solution, **row):
        raise KeyError("no level")


def rows(count: int = 10):  # every secret is 7 (mod 10)
    return [{"question": f"Find the secret {i}.", "answer": str(7 + 10 * i)} for i in range(count)]
'''


RESET_TEXT = "A secret digit from 0 to 9."  # Stepped.reset's, joined to the last user message after a blank line


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    return write_user_module(tmp_path, monkeypatch, "native_envs", ENVIRONMENTS)


def guards(timeout: float = 1.0, max_chars: int = 200) -> Guards:
    return Guards(timeout, 1.0, max_chars, FailureBudget(1.0, 10, lambda *counts: "spent"))


def environment(name: str = "Stepped", timeout: float = 1.0):
    (env,) = load_environments(f"native_envs:{name}", timeout).values()
    return env


# ---- which loop can serve ----------------------------------------------------------------------------------------


def test_trls_loop_serves_a_template_that_supports_tools_and_says_why_not_otherwise():
    cfg = compose_config(TINY_RUN)
    smollm2 = load_tokenizer(cfg.model, cfg.cache_dir)
    assert "cannot render a tool-calling conversation" in why_not_native(smollm2)
    qwen3 = load_tokenizer(compose_config([*TINY_RUN, f"model.chat_template={QWEN3_TEMPLATE}"]).model, cfg.cache_dir)
    assert why_not_native(qwen3) is None
    assert qwen3.response_template is not None  # TRL's parser of its tool calls, set


def native_run(*overrides: str) -> list[str]:
    return [
        *TINY_RUN,
        "logger=none",
        "dataset=function",
        "dataset.function=native_envs:rows",
        "dataset.eval_size=2",
        "rollout=environment",
        "reward=environment",
        "rollout.environment=native_envs:Stepped",
        "rollout.max_turns=2",
        "trainer.prompts_per_step=2",
        "eval.before=false",
        "eval.after=false",
        *overrides,
    ]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([], "rollout.tool_calling=native: tiny's chat template cannot render a tool-calling conversation"),
        ([f"model.chat_template={QWEN3_TEMPLATE}", "eval.before=true"], "eval.before: grpo_exp's held-out evaluation"),
        ([f"model.chat_template={QWEN3_TEMPLATE}", "rollout.demo=[{role: user, content: hi}]"], "rollout.demo is read"),
        ([f"model.chat_template={QWEN3_TEMPLATE}", "rollout.max_tokens_per_turn=8"], "not each turn"),
        ([f"model.chat_template={QWEN3_TEMPLATE}", "rollout.describe_tools=false"], "the chat template describes"),
        (
            [f"model.chat_template={QWEN3_TEMPLATE}", "rollout.turn_credit=discounted_return"],
            "needs grpo_exp's loop's turns",
        ),
    ],
)
def test_what_trls_loop_cannot_serve_is_refused_saying_why(user_module, overrides, message, no_model_loads):
    with pytest.raises(UserError, match=message):
        resolve(compose_config(native_run("rollout.tool_calling=native", *overrides)))


def test_tool_calling_without_an_environment_is_refused(no_model_loads):
    with pytest.raises(UserError, match="rollout.tool_calling=native is read only by an environment"):
        resolve(
            compose_config(
                [*TINY_RUN, "rollout=multiturn", "rollout.tools=[calculator]", "rollout.tool_calling=native"]
            )
        )


def test_auto_takes_trls_loop_where_the_template_can_and_grpo_exps_elsewhere(user_module, no_model_loads):
    assert not resolve(compose_config(native_run("rollout.tool_calling=auto"))).native_tool_calling
    qwen3 = f"model.chat_template={QWEN3_TEMPLATE}"
    assert resolve(compose_config(native_run("rollout.tool_calling=auto", qwen3))).native_tool_calling
    assert not resolve(compose_config(native_run(qwen3))).native_tool_calling  # tags by default
    # what only grpo_exp's loop does (here: the held-out evaluation) makes auto take it
    assert not resolve(
        compose_config(native_run("rollout.tool_calling=auto", qwen3, "eval.before=true"))
    ).native_tool_calling


# ---- the class TRL is given --------------------------------------------------------------------------------------


def test_trl_describes_the_guarded_method_as_the_users_own(user_module):
    import native_envs

    guarded = guarded_class(environment(), guards())()
    assert get_json_schema(guarded.probe) == get_json_schema(native_envs.Stepped().probe)
    assert not hasattr(guarded, "get_reward")  # the `environment` reward component scores it, not TRL


def test_each_reset_is_a_new_episode_of_the_users_instance_and_calls_reach_it(user_module):
    guarded = guarded_class(environment(), guards())()
    # its text after a blank line, as grpo_exp's loop joins it (TRL appends it as it is)
    assert guarded.reset(question="q", solution="3", prompt=[], environment=None) == "\n\nA secret digit from 0 to 9."
    first = guarded.episode
    assert guarded.probe(digit=1) == "wrong" and guarded.probe(digit=3) == "right"
    first.finish()
    assert first.reward == 0.75 and first.success is False  # success at 1.0
    guarded.reset(question="q", solution="5")
    assert guarded.episode is not first and guarded.episode.instance is not first.instance


def test_a_method_past_its_time_limit_or_a_raising_reset_costs_the_episode(user_module):
    slow = guarded_class(environment("Slow", timeout=0.2), guards(0.2))()
    slow.reset(question="q", solution="3")
    started = time.monotonic()
    assert slow.probe(digit=3) == "error: probe timed out"
    assert time.monotonic() - started < 10  # not the probe's 30 s (bounds with room: this tier runs at nice 19)
    assert "probe ran past rollout.environment_timeout_s=0.2" in slow.episode.failure
    assert slow.probe(digit=3).startswith("error: the episode failed")  # not called again
    broken = guarded_class(environment("Broken"), guards())()
    assert broken.reset(question="q", solution="3") is None
    assert "reset raised KeyError" in broken.episode.failure
    broken.episode.finish()
    assert broken.episode.reward is None  # missing: imputed, counted
    episodes = settled_episodes([slow, broken])
    assert [episode.failure is not None for episode in episodes] == [True, True]


def test_a_methods_result_is_cut_to_the_observation_limit(user_module):
    guarded = guarded_class(environment(), guards(max_chars=3))()
    guarded.reset(question="q", solution="3")
    assert guarded.probe(digit=1) == "wro"


def test_the_system_message_joins_the_datasets_prompts():
    from datasets import Dataset

    rows = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "a"}]},
            {"prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "b"}]},
        ]
    )
    prompts = with_system(rows, "Use the tools.")["prompt"]
    assert prompts[0][0] == {"role": "system", "content": "Use the tools."}
    assert prompts[1][0] == {"role": "system", "content": "Use the tools.\n\nown"}
    assert with_system(rows, None) is rows


# ---- a run through TRL's loop ------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_same_class_trains_through_trls_tool_calling_loop(user_module):
    """A tiny model with Qwen3's template, taught to answer with <tool_call>probe(7)</tool_call>: TRL parses the call,
    the user's method runs (step rewards, get_reward), and the `environment` component scores every episode. The same
    class then trains through grpo_exp's loop too."""
    import native_envs

    from grpo_exp.data import load_splits

    # four training prompts, all taught: a step of the teaching scores each prompt's answer over the whole vocabulary
    # (about 88 steps: 52 CPU-s for the eight prompts of before, 19 for four, AVX2-only EPYC)
    four = "dataset.train_size=4"
    cfg = compose_config(native_run(four, f"model.chat_template={QWEN3_TEMPLATE}"))
    train, _ = load_splits(cfg.dataset)
    prompts = [  # as TRL will render them: rollout.system first, reset's text after a blank line
        [{"role": "system", "content": cfg.rollout.system}, {**p[-1], "content": f"{p[-1]['content']}\n\n{RESET_TEXT}"}]
        for p in train["prompt"]
    ]
    guarded = guarded_class(environment(), guards())()
    call = '<tool_call>\n{"name": "probe", "arguments": {"digit": 7}}\n</tool_call>'
    model = taught_tool_caller(user_module / "caller", prompts, [guarded.probe], call)
    run = user_module / "run"
    args = native_run(
        four,
        "model=pretrained",
        f"model.name_or_path={model}",
        "model.dtype=float32",
        "rollout.tool_calling=native",
        "trainer.max_steps=2",
        "trainer.max_completion_length=64",
        f"hydra.run.dir={run}",
    )
    result = run_command([sys.executable, "-m", "grpo_exp.train", *args], cwd=user_module)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = trained_steps(run, 2)
    # TRL's loop called the method; every secret is 7 (mod 10), so the taught call wins every episode it makes
    assert any(step["tools/call_frequency"] > 0 for step in steps)
    assert any(step["environment/Stepped/reward_mean"] > 0 for step in steps)
    assert all(step["environment/Stepped/failures"] == 0.0 for step in steps)
    assert native_envs  # the user's module, imported by the run as by this test
    # the same class, unchanged, through grpo_exp's loop (tags) on the tiny model, whose template has no tools
    tags = native_run("trainer.max_steps=1", f"hydra.run.dir={user_module / 'tags'}")
    result = run_command([sys.executable, "-m", "grpo_exp.train", *tags], cwd=user_module)
    assert result.returncode == 0, result.stderr[-3000:]
    (step,) = trained_steps(user_module / "tags", 1)
    assert step["environment/Stepped/failures"] == 0.0
