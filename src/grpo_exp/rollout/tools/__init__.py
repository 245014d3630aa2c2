"""Tools the policy can call in a multi-turn rollout (rollout=multiturn), and their call protocol.

    calculator   <calc>12 * 34</calc>                  ->  <result>408</result>
    python       ```python\\nprint(12 * 34)\\n```       ->  ```output\\n408\\n```

Plain tags and fenced blocks, because SmolLM2-135M-Instruct writes them after one demonstration, sampled at
temperature 1 (`python -m benchmarks.tool_protocol`: 56% calculator tags, 59% python blocks), against 9% for
TRL's JSON tool calls shown the same way (0% for the tags described without a demonstration).
A call ends the policy's turn; the tool's output (or error) is appended as an observation, which the policy
reads in its next turn and which is masked out of the loss.
"""

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from grpo_exp.errors import UserError
from grpo_exp.rollout.tools.calculator import CalculatorError, calculate, format_number
from grpo_exp.rollout.tools.python_sandbox import SandboxLimits, run_python
from grpo_exp.rollout.tools.result import ToolResult


@dataclass(frozen=True)
class Tool:
    name: str
    call: re.Pattern  # a complete call; group 1 is the tool's input
    observation: str  # how the output is shown to the policy ({output})
    run: Callable[[str], ToolResult]


@dataclass(frozen=True)
class ToolCall:
    tool: Tool
    argument: str
    end: int  # where the call ends in the turn's text


def run_calculator(expression: str) -> ToolResult:
    try:
        return ToolResult(format_number(calculate(expression)), False)
    except CalculatorError as err:
        return ToolResult(f"error: {err}", True)


TOOL_NAMES = ("calculator", "python")


def build_tools(names: list[str], python_limits: SandboxLimits) -> list[Tool]:
    """The named tools (check_tool_names first: the resolve phase)."""
    available = {
        "calculator": Tool(
            "calculator", re.compile(r"<calc>(.*?)</calc>", re.S), "\n<result>{output}</result>\n", run_calculator
        ),
        "python": Tool(
            "python",
            re.compile(r"```python\n(.*?)```", re.S),
            "\n```output\n{output}\n```\n",
            functools.partial(run_python, limits=python_limits),
        ),
    }
    return [available[name] for name in names]


def check_tool_names(names: list[str]) -> None:
    unknown = [name for name in names if name not in TOOL_NAMES]
    if unknown:
        raise UserError(f"rollout.tools: unknown tool(s) {unknown}; the tools are {sorted(TOOL_NAMES)}")
    if not names:
        raise UserError(f"rollout.tools is empty; rollout=multiturn needs some of {sorted(TOOL_NAMES)}")


def first_call(text: str, tools: list[Tool]) -> ToolCall | None:
    """The call that completes first in a turn's text (generation stops there), if any."""
    calls = [ToolCall(tool, match.group(1), match.end()) for tool in tools if (match := tool.call.search(text))]
    return min(calls, key=lambda call: call.end, default=None)
