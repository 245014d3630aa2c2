"""The user's own tools in multi-turn rollouts (rollout.tools=[calculator,module:function]): the call's text mapped onto
the function's parameters by their type hints, errors as observations, the tool described in the system message the
policy reads and run by the rollout's own turn handling, and every mistake one message naming the key before any
model loads (from a user's project directory, in a fresh process)."""

import asyncio
import json
import textwrap
from pathlib import Path

import pytest
import yaml
from trl.trainer.utils import is_async_callable

from grpo_exp.errors import UserError
from grpo_exp.models import load_tokenizer
from grpo_exp.rollout.multiturn import MultiTurnRollout, Trajectory, scored_on_final_turn
from grpo_exp.rollout.tools import build_tools, check_tool_names, first_call, tools_message
from grpo_exp.rollout.tools.python_sandbox import SandboxLimits
from grpo_exp.rollout.tools.user import load_user_tool
from grpo_exp.run.tracking import read_metrics
from support.config import TINY_RUN, compose_config
from tests.helpers.resolve_cases import resolve_cases
from tests.test_plugins import grpo_exp  # `grpo-exp ARGS` run from a project directory
from tests.test_user_rubric import MINE  # two criteria, each 1-3

# ---- tools, importable as tests.test_user_tools:<name> ---------------------------------------------------------


def capital(country: str) -> str:
    """The capital city of a country.

    Args:
        country: the country's name in English
    """
    capitals = {"France": "Paris", "Japan": "Tokyo"}
    if country not in capitals:
        raise KeyError(f"no capital known for {country!r}")
    return capitals[country]


def square(n: int) -> int:
    """The square of a whole number."""
    return n * n


def halve(x: float) -> float:
    """Half of a number."""
    return x / 2


def negate(flag: bool) -> bool:
    """The opposite truth value."""
    return not flag


def total(numbers: list[float]) -> float:
    """The sum of a list of numbers."""
    return sum(numbers)


def maybe(n: int | None) -> str:
    """Whether a number was given."""
    return "nothing" if n is None else f"got {n}"


def convert(amount: float, currency: str, rounded: bool = False) -> dict:
    """Convert an amount of euros into another currency.

    Args:
        amount: how many euros
        currency: the ISO code of the target currency
        rounded: whether to round to a whole number
    """
    rate = {"USD": 1.1, "JPY": 160.0}[currency]
    value = amount * rate
    return {"currency": currency, "value": round(value) if rounded else value}


def today() -> str:
    """Today's date."""
    return "2024-05-01"


def nothing(text: str) -> None:
    """Returns nothing."""


LIMITS = SandboxLimits(timeout_s=20.0)  # time to spare at the lowest CPU priority (support/test_tiers.py)


def tool(name: str):
    return load_user_tool(f"tests.test_user_tools:{name}", "rollout.tools[0]")


@pytest.mark.parametrize(
    ("name", "text", "output"),
    [
        ("capital", " France ", "Paris"),  # str: stripped
        ("square", "12", "144"),  # int
        ("square", "1,200", "1440000"),  # a thousands separator
        ("halve", "5", "2.5"),  # float
        ("negate", "yes", "False"),  # bool
        ("negate", "FALSE", "True"),
        ("total", "[1, 2.5, 3]", "6.5"),  # list: JSON
        ("maybe", "", "nothing"),  # X | None: empty -> None
        ("maybe", "7", "got 7"),
        ("today", "whatever", "2024-05-01"),  # no parameter: the text is ignored
        ("nothing", "x", "(no output)"),  # None returned
        ("convert", '{"amount": 10, "currency": "USD"}', '{"currency": "USD", "value": 11.0}'),  # several: JSON object
        ("convert", '{"amount": "10", "currency": "JPY", "rounded": true}', '{"currency": "JPY", "value": 1600}'),
    ],
)
def test_the_calls_text_becomes_the_arguments_by_type_hints(name, text, output):
    result = tool(name).run(text)
    assert (result.output, result.error) == (output, False)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("square", "twelve", "error: square takes n (integer): 'twelve' is not an integer"),
        ("square", "2.5", "error: square takes n (integer): '2.5' is not an integer"),
        ("negate", "maybe", "error: negate takes flag (boolean): 'maybe' is not a boolean"),
        ("total", "1 2 3", "error: total takes numbers (array): '1 2 3' is not a JSON array"),
        ("total", '["a"]', "error: total takes numbers (array): 'a' is not a number"),
        (
            "convert",
            "10 USD",
            'error: convert takes a JSON object of its arguments: <convert>{"amount": number, "currency": string, '
            '"rounded": boolean}</convert>',
        ),
        ("convert", '{"amount": 10}', "error: convert needs the argument 'currency'"),
        (
            "convert",
            '{"amount": 1, "currency": "USD", "speed": 2}',
            "error: convert has no argument 'speed'; its arguments: amount (number), currency (string), rounded "
            "(boolean, default false)",
        ),
        ("convert", '{"amount": [1], "currency": "USD"}', "error: convert's argument 'amount': [1] is not a number"),
        # What the function raises is an observation too, never a crash of the run.
        ("capital", "Atlantis", "error: KeyError: \"no capital known for 'Atlantis'\""),
        ("convert", '{"amount": 1, "currency": "XYZ"}', "error: KeyError: 'XYZ'"),
    ],
)
def test_a_call_that_cannot_be_made_or_raises_is_an_error_observation(name, text, message):
    result = tool(name).run(text)
    assert result.error
    assert result.output.startswith(message), result.output


def test_the_system_message_describes_the_users_tools_from_their_docstrings_and_hints():
    tools = build_tools(
        ["calculator", "tests.test_user_tools:capital", "tests.test_user_tools.convert", "tests.test_user_tools:today"],
        LIMITS,
    )
    assert [t.name for t in tools] == ["calculator", "capital", "convert", "today"]
    assert tools[0].description is None  # the built-ins are rollout.system's to describe
    assert tools_message(tools) == (
        "You can call these tools: write the call as shown and its result is shown as <result>value</result>.\n"
        "- <capital>country</capital>: The capital city of a country. country (string): the country's name in "
        "English.\n"
        '- <convert>{"amount": number, "currency": string, "rounded": boolean}</convert>: Convert an amount of euros '
        "into another currency. amount (number): how many euros; currency (string): the ISO code of the target "
        "currency; rounded (boolean, optional): whether to round to a whole number.\n"
        "- <today></today>: Today's date."
    )
    assert tools_message(build_tools(["calculator", "python"], LIMITS)) is None
    call = first_call("Let me look. <capital>Japan</capital> and <calc>1+1</calc>", tools)
    assert (call.tool.name, call.argument, call.tool.run(call.argument).output) == ("capital", "Japan", "Tokyo")


MULTITURN = [*TINY_RUN, "rollout=multiturn", "rollout.tools=[calculator,tests.test_user_tools:capital]"]


@pytest.fixture(scope="module")
def rollout_and_tokenizer():
    cfg = compose_config(MULTITURN)
    return MultiTurnRollout(cfg.rollout), load_tokenizer(cfg.model, cfg.cache_dir)


def test_the_policy_sees_the_users_tool_after_rollout_system(rollout_and_tokenizer):
    rollout, tokenizer = rollout_and_tokenizer
    messages = rollout.messages([{"role": "user", "content": "What is the capital of France?"}])
    system = messages[0]["content"]
    assert messages[0]["role"] == "system" and system.startswith(rollout.cfg.system)
    assert "<capital>country</capital>: The capital city of a country." in system
    rendered = tokenizer.decode(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    )
    assert "<capital>country</capital>" in rendered and "<calc>12 * 34</calc>" in rendered  # and the demo
    quiet = MultiTurnRollout(compose_config([*MULTITURN, "rollout.describe_tools=false"]).rollout)
    assert quiet.messages([{"role": "user", "content": "q"}])[0]["content"] == rollout.cfg.system


def test_a_scripted_turn_calling_the_users_tool_runs_it_through_the_rollout(rollout_and_tokenizer):
    """The rollout's own turn handling (what it does with each generated turn): the call is executed and its output
    appended as a masked observation; an error is an observation too; a turn without a call ends the trajectory."""
    rollout, tokenizer = rollout_and_tokenizer
    trajectory = Trajectory(prompt_ids=[1, 2, 3], tools=rollout.tools)
    for text in ("I will look it up. <capital>France</capital>", "<capital>Atlantis</capital>", "\\boxed{Paris}"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        rollout._advance(trajectory, ids, tokenizer, last_turn=False)
    assert trajectory.observations == [
        "\n<result>Paris</result>\n",
        "\n<result>error: KeyError: \"no capital known for 'Atlantis'\"</result>\n",
    ]
    assert (trajectory.tool_calls, trajectory.tool_errors, trajectory.ended) == (2, 1, True)
    assert trajectory.final_turn == "\\boxed{Paris}"
    masked = [i for i, m in zip(trajectory.completion_ids, trajectory.env_mask, strict=True) if not m]
    assert tokenizer.decode(masked) == "".join(trajectory.observations)


def test_the_rewards_see_the_final_turn_by_name_and_an_async_one_stays_async():
    """TRL passes every argument by name and awaits async reward functions (the judge's takes `prompts` first)."""

    async def judge_like(prompts, completions, **kwargs):
        return [float(len(c[-1]["content"])) for c in completions]

    def sync_like(prompts, completions, **kwargs):
        return [float(len(c[-1]["content"])) for c in completions]

    arguments = {"prompts": ["p", "q"], "completions": ["<calc>1</calc> ok", "x"], "final_turn": ["ok", ""]}
    wrapped = scored_on_final_turn(judge_like)
    assert is_async_callable(wrapped) and asyncio.run(wrapped(**arguments, completion_ids=[[1], [2]])) == [2.0, 0.0]
    assert not is_async_callable(scored_on_final_turn(sync_like))
    assert scored_on_final_turn(sync_like)(**arguments) == [2.0, 0.0]


def test_unknown_and_repeated_tools_are_named():
    with pytest.raises(UserError, match=r"unknown tool\(s\) \['shell'\]; .* or your own function by import path"):
        check_tool_names(["calculator", "shell"])
    with pytest.raises(UserError, match=r"rollout.tools: \['calculator'\] named more than once"):
        check_tool_names(["calculator", "calculator"])


# ---- the resolve phase, from a user's project directory ------------------------------------------------------------

USER_TOOLS = '''
import asyncio


def lookup(city: str) -> str:
    """The country a city is in."""
    return {"Paris": "France"}.get(city, "unknown")


def lookup_again(city: str) -> str:
    """The same, under another module path."""
    return city


def no_hints(city) -> str:
    """The country a city is in."""
    return city


def no_doc(city: str) -> str:
    return city


def calc(expression: str) -> str:
    """A second calculator."""
    return expression


def variadic(*cities: str) -> str:
    """Several cities."""
    return ",".join(cities)


def odd_type(when: complex) -> str:
    """An unsupported type."""
    return str(when)


async def slow(city: str) -> str:
    """Async."""
    return city


NOT_CALLABLE = 3
'''

TOOLS = "rollout.tools=[calculator,user_tools:{}]"
RESOLVE_CASES = {
    "bad module": (
        "rollout.tools=[calculator,no_such_tools:lookup]",
        "rollout.tools[1]=no_such_tools:lookup: module 'no_such_tools' not found",
    ),
    "bad attribute": (
        TOOLS.format("lookup_nope"),
        "rollout.tools[1]=user_tools:lookup_nope: module 'user_tools' has no",
    ),
    "not callable": (TOOLS.format("NOT_CALLABLE"), "rollout.tools[1]=user_tools:NOT_CALLABLE: not callable (int 3)"),
    "no hints": (TOOLS.format("no_hints"), "rollout.tools[1]=user_tools:no_hints: parameter 'city' has no type hint"),
    "no docstring": (TOOLS.format("no_doc"), "rollout.tools[1]=user_tools:no_doc: no docstring"),
    "built-in name": (TOOLS.format("calc"), "rollout.tools[1]=user_tools:calc: the name 'calc' is a built-in tool's"),
    "variadic": (TOOLS.format("variadic"), "rollout.tools[1]=user_tools:variadic: a tool's arguments are its named"),
    "odd type": (TOOLS.format("odd_type"), "rollout.tools[1]=user_tools:odd_type: parameter 'when: complex' is not"),
    "async": (TOOLS.format("slow"), "rollout.tools[1]=user_tools:slow: an async function"),
    "same tag": (
        "rollout.tools=[user_tools:lookup,more.user_tools:lookup]",
        "rollout.tools[1]=more.user_tools:lookup: the tag <lookup> is already rollout.tools[0]=user_tools:lookup's",
    ),
    "good": (TOOLS.format("lookup"), None),
}

REPORT = """
def report(spec):
    return list(spec.cfg.rollout.tools)
"""


def test_a_bad_tool_is_one_message_naming_its_key_before_any_model_loads(tmp_path: Path):
    (tmp_path / "user_tools.py").write_text(USER_TOOLS)
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "user_tools.py").write_text(USER_TOOLS)
    base = [*TINY_RUN, "logger=none", "rollout=multiturn"]
    cases = {name: [override] for name, (override, _) in RESOLVE_CASES.items()}
    messages = resolve_cases(cases, base, cwd=tmp_path, report=REPORT)
    for name, (_, expected) in RESOLVE_CASES.items():
        if expected is None:
            assert messages[name] == ["calculator", "user_tools:lookup"], messages[name]
        else:
            assert expected in messages[name], (name, messages[name])


# ---- end to end: the user's tool and rubric in one run ---------------------------------------------------------

CALL_LOGGING_TOOL = '''
import json


def lookup(city: str) -> str:
    """The country a city is in.

    Args:
        city: the city's name
    """
    with open("tool_calls.jsonl", "a") as f:
        f.write(json.dumps(city) + "\\n")
    return {"Paris": "France"}.get(city, "unknown")
'''


@pytest.mark.e2e
def test_training_with_the_users_tool_and_rubric_from_a_project_directory(tmp_path: Path):
    """`grpo-exp train --config-dir configs rollout=multiturn rollout.tools=[calculator,user_tools:lookup]
    reward=math+judge judge/rubric=mine`: TRL's GRPOTrainer trains the tiny model two steps with the user's tool in
    the rollout and the user's two-criterion rubric scoring (score tokens, the tiny judge)."""
    (tmp_path / "user_tools.py").write_text(CALL_LOGGING_TOOL)
    rubric = tmp_path / "configs" / "judge" / "rubric" / "mine.yaml"
    rubric.parent.mkdir(parents=True)
    rubric.write_text(textwrap.dedent(MINE))
    run_dir = tmp_path / "run"
    result = grpo_exp(
        tmp_path, "train", "--config-dir", "configs", *TINY_RUN, "logger=none", "eval.before=false",
        "dataset.eval_size=2", "rollout=multiturn", "rollout.tools=[calculator,user_tools:lookup]",
        "rollout.max_turns=2", "rollout.max_tokens_per_turn=12", "reward=math+judge", "judge.model=tiny",
        "judge/rubric=mine", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rewards/judge/mean" in m]
    assert len(steps) == 2
    # Every pair scored from the two criteria's 1-3 score tokens: mean / 3 lies in [1/3, 1].
    assert all(m["judge/failures"] == 0 and 1 / 3 - 1e-6 <= m["rewards/judge/mean"] <= 1 for m in steps)
    assert all("rollout/tool_calls_mean" in m for m in steps)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["judge"]["rubric"]["criteria"] == ["correctness", "clarity"]
    assert saved["rollout"]["tools"] == ["calculator", "user_tools:lookup"]
    calls = tmp_path / "tool_calls.jsonl"  # the random policy rarely writes <lookup>...</lookup>; if it did, it ran
    if calls.exists():
        assert all(isinstance(json.loads(line), str) for line in calls.read_text().splitlines())
