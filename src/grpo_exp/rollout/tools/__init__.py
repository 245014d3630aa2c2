"""Tools the policy can call in a multi-turn rollout (rollout=multiturn), and their call protocol.

    calculator   <calc>12 * 34</calc>                  ->  <result>408</result>
    python       ```python\\nprint(12 * 34)\\n```       ->  ```output\\n408\\n```

Plain tags and fenced blocks, because SmolLM2-135M-Instruct writes them after one demonstration, sampled at
temperature 1 (`python -m benchmarks.tool_protocol`: 56% calculator tags, 59% python blocks), against 9% for
TRL's JSON tool calls shown the same way (0% for the tags described without a demonstration).
A call ends the policy's turn; the tool's output (or error) is appended as an observation, which the policy
reads in its next turn and which is masked out of the loss.

The user's own functions join them by import path (rollout.tools=[calculator,my_tools:lookup]), with the same
plain tags: `<lookup>Paris</lookup>` -> `<result>France</result>`, the text mapped onto the function's parameters by
their type hints (grpo_exp.rollout.tools.user), and described to the policy in the system message.
"""

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from grpo_exp.errors import UserError
from grpo_exp.registries import by_name
from grpo_exp.rollout.tools.calculator import CalculatorError, calculate, format_number
from grpo_exp.rollout.tools.python_sandbox import SandboxLimits, run_python
from grpo_exp.rollout.tools.result import ToolResult
from grpo_exp.rollout.tools.user import UserTool, check_user_tools, is_import_path


@dataclass(frozen=True)
class Tool:
    name: str
    call: re.Pattern  # a complete call; group 1 is the tool's input
    observation: str  # how the output is shown to the policy ({output})
    run: Callable[[str], ToolResult]
    description: str | None = None  # a user's tool: what the system message tells the policy of it
    # the text that completes a call, where a string can tell (vLLM ends a turn there; a python block's closing
    # fence cannot be told from its opening one: its turn runs on and is cut where the call completes)
    stop: str | None = None


@dataclass(frozen=True)
class ToolCall:
    tool: Tool
    argument: str
    end: int  # where the call ends in the turn's text


OBSERVATION = "\n<result>{output}</result>\n"
# name -> f(the python sandbox's limits) -> Tool, each registered beside its code (`@builtin_tool(name)`)
TOOLS: dict[str, Callable[[SandboxLimits], Tool]] = {}


# Decorator: `@builtin_tool(name)` on a function that, given the python sandbox's limits (rollout.python), makes the
# built-in tool `name` (rollout.tools=[name]).
builtin_tool = by_name(TOOLS, "a tool named")


def run_calculator(expression: str) -> ToolResult:
    try:
        return ToolResult(format_number(calculate(expression)), False)
    except CalculatorError as err:
        return ToolResult(f"error: {err}", True)


@builtin_tool("calculator")
def calculator_tool(python_limits: SandboxLimits) -> Tool:
    return Tool("calculator", re.compile(r"<calc>(.*?)</calc>", re.S), OBSERVATION, run_calculator, stop="</calc>")


@builtin_tool("python")
def python_tool(python_limits: SandboxLimits) -> Tool:
    return Tool(
        "python",
        re.compile(r"```python\n(.*?)```", re.S),
        "\n```output\n{output}\n```\n",
        functools.partial(run_python, limits=python_limits),
    )


def build_tools(names: list[str], python_limits: SandboxLimits) -> list[Tool]:
    """The named tools, built-in or the user's by import path (check_tool_names first: the resolve phase)."""
    users = iter([user_tool(tool) for tool in check_user_tools(user_tool_paths(names))])
    return [next(users) if is_import_path(name) else TOOLS[name](python_limits) for name in names]


def user_tool(tool: UserTool) -> Tool:
    """A user's function as a tool: called as <name>argument</name>, answered in <result> like the calculator."""
    call = re.compile(rf"<{tool.name}>(.*?)</{tool.name}>", re.S)
    return Tool(tool.name, call, OBSERVATION, tool.run, tool.system_text(), stop=f"</{tool.name}>")


def user_tool_paths(names: list[str]) -> dict[str, str]:
    """rollout.tools[i] -> import path, for the entries that name the user's functions."""
    return {f"rollout.tools[{i}]": name for i, name in enumerate(names) if is_import_path(name)}


def check_tool_names(names: list[str]) -> None:
    """The resolve phase: built-in names known, the user's functions imported and checked (one UserError each)."""
    if not names:
        raise UserError(
            f"rollout.tools is empty; rollout=multiturn needs some of {sorted(TOOLS)} or your own functions "
            "(module:name)"
        )
    unknown = [name for name in names if not is_import_path(name) and name not in TOOLS]
    if unknown:
        raise UserError(
            f"rollout.tools: unknown tool(s) {unknown}; the tools are {sorted(TOOLS)}, or your own function "
            "by import path (module:name, e.g. rollout.tools=[calculator,my_tools:lookup])"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"rollout.tools: {repeated} named more than once")
    check_user_tools(user_tool_paths(names))


def tools_message(tools: list[Tool]) -> str | None:
    """What the system message tells the policy of the user's tools (from their docstrings and type hints)."""
    described = [tool.description for tool in tools if tool.description]
    if not described:
        return None
    lines = "\n".join(f"- {description}" for description in described)
    return (
        f"You can call these tools: write the call as shown and its result is shown as <result>value</result>.\n{lines}"
    )


def first_call(text: str, tools: list[Tool]) -> ToolCall | None:
    """The call that completes first in a turn's text (generation stops there), if any."""
    calls = [ToolCall(tool, match.group(1), match.end()) for tool in tools if (match := tool.call.search(text))]
    return min(calls, key=lambda call: call.end, default=None)
