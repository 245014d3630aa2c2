"""The tools of multi-turn rollouts on good and hostile input: answers, refusals and limits, never a hang."""

import time

import pytest

from grpo_exp.errors import UserError
from grpo_exp.rollout.tools import build_tools, check_tool_names, first_call, run_calculator
from grpo_exp.rollout.tools.calculator import CalculatorError, calculate, format_number
from grpo_exp.rollout.tools.python_sandbox import SandboxLimits, run_python


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 * 34", 408),
        ("(56 + -33) * -50", -1150),
        ("7 / 2", 3.5),
        ("2 ** 10", 1024),
        ("17 // 5 % 2", 1),
        ("3 × 4 ÷ 2", 6.0),
        ("2^3", 8),
        ("1,234 + 1", 1235),
        ("-(-5)", 5),
        ("0.1 + 0.2", 0.1 + 0.2),
    ],
)
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("9 ** 9 ** 9", "exponent"),  # a power tower: refused before it is computed
        ("10 ** 99 * 10 ** 99", "too large"),
        ("1 / 0", "division by zero"),
        ("__import__('os').system('echo pwned')", "not Call"),
        ("().__class__.__bases__", "not Attribute"),
        ("x + 1", "not Name"),
        ("'a' * 10", "not Constant"),
        ("{1: 2}", "not Dict"),
        ("lambda: 1", "not Lambda"),
        ("1 +", "not an arithmetic expression"),
        ("", "empty"),
        ("1+" * 200 + "1", "longer than"),
        ("0 ** -1", "exponent"),
    ],
)
def test_calculator_refuses_everything_else_with_a_reason(expression, reason):
    with pytest.raises(CalculatorError, match=reason):
        calculate(expression)


def test_calculator_tool_reports_errors_to_the_policy():
    assert run_calculator("12*34").output == "408" and not run_calculator("12*34").error
    failed = run_calculator("import os")
    assert failed.error and failed.output.startswith("error: ")


def test_numbers_are_shown_as_a_person_would_write_them():
    assert format_number(408.0) == "408"
    assert format_number(3.5) == "3.5"
    assert format_number(1 / 3) == "0.3333333333"
    assert format_number(-1150) == "-1150"


# A snippet that should finish gets time to spare: make test runs this tier at the lowest CPU priority beside the
# e2e tier (support/test_tiers.py), where starting the sandbox's interpreter can take over a second. Only the tests
# of the time limit itself use a short one.
FAST = SandboxLimits(timeout_s=20.0, memory_mb=256, max_output_chars=100)
SHORT_TIME = SandboxLimits(timeout_s=1.0, memory_mb=256, max_output_chars=100)


def test_python_tool_runs_a_snippet_with_the_standard_math_modules():
    result = run_python("import math, fractions\nprint(math.factorial(10), fractions.Fraction(6, 8))", FAST)
    assert result == type(result)("3628800 3/4", False)
    assert run_python("x = 3", FAST).output.startswith("(no output")


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ("import os\nos.system('echo pwned')", "import of 'os' is not allowed"),
        ("import socket\nsocket.create_connection(('example.com', 80))", "import of 'socket' is not allowed"),
        ("import subprocess\nsubprocess.run(['ls'])", "import of 'subprocess' is not allowed"),
        ("__import__('ctypes')", "import of 'ctypes' is not allowed"),
        # os reached through a module that holds it: the audit hook refuses the act itself
        ("import random\nrandom._os.system('echo pwned')", "os.system is not allowed"),
        ("import random\nrandom._os.fork()", "os.fork is not allowed"),
        ("import random\nrandom._os.remove('/tmp/x')", "os.remove is not allowed"),
        (
            "[c for c in object.__subclasses__() if c.__name__ == '_wrap_close'][0]"
            ".__init__.__globals__['system']('id')",
            "os.system is not allowed",
        ),
        ("import sys\nsys._getframe().f_back.f_globals", "sys._getframe is not allowed"),
        ("open('/tmp/grpo_exp_pwned', 'w').write('x')", "writing files is not allowed"),
        ("print(open('/proc/self/environ').read())", "reading files is not allowed"),  # API keys live there
        ("x = [0] * 10**10", "MemoryError"),
        ("print(", "SyntaxError"),
        ("raise ValueError('bad')", "ValueError: bad"),
    ],
)
def test_python_tool_refuses_or_limits_hostile_snippets(snippet, message):
    result = run_python(snippet, FAST)
    assert result.error
    assert message in result.output
    assert "pwned" not in result.output


@pytest.mark.parametrize(
    "snippet",
    ["while True: pass", "import time\ntime.sleep(30)"],  # wall clock, not only CPU time
)
def test_python_tool_stops_a_snippet_at_its_time_limit(snippet):
    started = time.monotonic()
    result = run_python(snippet, SHORT_TIME)
    assert result.error and "time limit of 1 s exceeded" in result.output
    assert time.monotonic() - started < 15


def test_python_tool_caps_huge_output():
    endless = run_python("while True: print('x' * 1000)", FAST)
    assert endless.error and "File too large" in endless.output
    one_big_line = run_python("print('y' * 99)\nprint('z' * 5000)", FAST)
    assert len(one_big_line.output) <= FAST.max_output_chars + len("... (truncated)")


def test_tool_calls_are_found_where_they_complete():
    tools = build_tools(["calculator", "python"], FAST)
    call = first_call("I will compute. <calc>12 * 34</calc>", tools)
    assert (call.tool.name, call.argument) == ("calculator", "12 * 34")
    call = first_call("```python\nprint(2 ** 10)\n``` then <calc>1+1</calc>", tools)
    assert (call.tool.name, call.tool.run(call.argument).output) == ("python", "1024")
    assert first_call("The answer is \\boxed{408}.", tools) is None
    assert first_call("<calc>12 * 34", tools) is None  # not closed: not a call


def test_unknown_tools_are_named_with_the_known_ones():
    with pytest.raises(UserError, match=r"unknown tool\(s\) \['shell'\]; the tools are \['calculator', 'python'\]"):
        check_tool_names(["calculator", "shell"])
