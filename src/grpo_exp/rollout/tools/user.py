"""The user's own tools (rollout.tools=[calculator,my_tools:lookup]): a Python function with type hints and a docstring,
as TRL takes any function as a tool, called with grpo_exp's plain-tag protocol.

    def lookup(city: str) -> str:
        '''The country a city is in.'''

    <lookup>Paris</lookup>                      ->  <result>France</result>

The tag is the last part of the import path (`my_tools:lookup` -> `<lookup>`). The text between the tags becomes
the function's arguments by their type hints:
- no parameter: the text is ignored, f() is called;
- one parameter: the text (stripped) converted to its type: str as it is, int, float, bool (true/false, yes/no,
  1/0), list or dict as JSON; `X | None` as X;
- several: a JSON object of them by name, `<forecast>{"city": "Paris", "days": 3}</forecast>`; each value converted
  to its parameter's type (a number written as a string is accepted), those with a default may be left out.
The output is the returned value as text (str as it is, a list or dict as JSON, None as "(no output)"). A call
that cannot be made (text not convertible, a missing or unknown argument) or that raises is an observation
`error: ...` the policy reads, as the built-in tools' errors are, never a crash of the run. The function runs in
the training process itself: no sandbox, no time limit (unlike the python tool).

Checked at resolve time (check_user_tool), before any model loads: the import path, a callable, a parameter list
that can be mapped (no *args, **kwargs or positional-only parameters), a type hint of a supported type on every
parameter, a docstring, not a coroutine, and a name that no built-in tool uses.
"""

import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.plugins import import_callable, signature_of
from grpo_exp.rollout.tools.result import ToolResult

# Names a user's tool cannot take: the built-in tools' names and the tags the protocol already writes.
RESERVED_NAMES = ("calculator", "python", "calc", "result", "output", "think", "answer")  # format's tags too
SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
CONTAINERS = {list: "array", dict: "object"}
SUPPORTED = "str, int, float, bool, list[...], dict[str, ...], or X | None of these"
TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0")


class ToolArgumentError(ValueError):
    """The call's text does not give the function its arguments: shown to the policy."""


@dataclass(frozen=True)
class Parameter:
    name: str
    annotation: Any
    required: bool
    default: Any = None


@dataclass(frozen=True)
class UserTool:
    """A checked user tool: its name (the tag), the function, its parameters and what the policy is told of it."""

    name: str
    path: str
    func: Callable
    parameters: tuple[Parameter, ...]
    description: str  # the function's, from its docstring
    parameter_descriptions: dict[str, str]  # from the docstring's Args section, where it has one

    def run(self, text: str) -> ToolResult:
        """The call `<name>text</name>`: its output, or `error: ...` (a bad argument, or what the function raised)."""
        try:
            kwargs = self.arguments(text)
        except ToolArgumentError as err:
            return ToolResult(f"error: {err}", True)
        try:
            return ToolResult(output_text(self.func(**kwargs)), False)
        except Exception as err:  # noqa: BLE001 - the user's tool failed: the policy reads why, the run goes on
            return ToolResult(
                f"error: {type(err).__name__}: {err}" if str(err) else f"error: {type(err).__name__}", True
            )

    def arguments(self, text: str) -> dict[str, Any]:
        """The call's text as the function's keyword arguments, by the parameters' type hints."""
        if not self.parameters:
            return {}
        if len(self.parameters) == 1:
            parameter = self.parameters[0]
            try:
                return {parameter.name: from_text(text.strip(), parameter.annotation)}
            except ToolArgumentError as err:
                raise ToolArgumentError(f"{self.name} takes {self.parameter_list}: {err}") from None
        try:
            given = json.loads(text)
        except json.JSONDecodeError:
            given = None
        if not isinstance(given, dict):
            raise ToolArgumentError(f"{self.name} takes a JSON object of its arguments: {self.call_example}")
        by_name = {p.name: p for p in self.parameters}
        unknown = [key for key in given if key not in by_name]
        if unknown:
            raise ToolArgumentError(f"{self.name} has no argument {unknown[0]!r}; its arguments: {self.parameter_list}")
        missing = [p.name for p in self.parameters if p.required and p.name not in given]
        if missing:
            raise ToolArgumentError(f"{self.name} needs the argument {missing[0]!r}: {self.call_example}")
        kwargs = {}
        for key, value in given.items():
            try:
                kwargs[key] = from_json(value, by_name[key].annotation)
            except ToolArgumentError as err:
                raise ToolArgumentError(f"{self.name}'s argument {key!r}: {err}") from None
        return kwargs

    @property
    def parameter_list(self) -> str:
        """`city (string), days (integer, default 3)`."""
        shown = [
            f"{p.name} ({type_name(p.annotation)})"
            if p.required
            else f"{p.name} ({type_name(p.annotation)}, default {json.dumps(p.default, default=str)})"
            for p in self.parameters
        ]
        return ", ".join(shown)

    @property
    def call_example(self) -> str:
        """How the policy writes a call: `<lookup>city</lookup>`, `<forecast>{"city": ..., "days": ...}</forecast>`."""
        if not self.parameters:
            return f"<{self.name}></{self.name}>"
        if len(self.parameters) == 1:
            return f"<{self.name}>{self.parameters[0].name}</{self.name}>"
        fields = ", ".join(f'"{p.name}": {type_name(p.annotation)}' for p in self.parameters)
        return f"<{self.name}>{{{fields}}}</{self.name}>"

    def system_text(self) -> str:
        """The tool as the system message describes it to the policy."""
        text = f"{self.call_example}: {self.description}"
        described = [
            f"{p.name} ({type_name(p.annotation)}{'' if p.required else ', optional'}): "
            f"{self.parameter_descriptions[p.name]}"
            for p in self.parameters
            if self.parameter_descriptions.get(p.name)
        ]
        return f"{text} {'; '.join(described)}." if described else text


def is_import_path(entry: str) -> bool:
    """A rollout.tools entry naming the user's function (module:name or module.name), not a built-in tool."""
    return ":" in entry or "." in entry


def tool_name(path: str) -> str:
    """The tag of the tool at `path`: the last part of its attribute (`my_tools:lookup` -> lookup)."""
    return path.partition(":")[2].rpartition(".")[2] if ":" in path else path.rpartition(".")[2]


def load_user_tool(path: str, key: str) -> UserTool:
    """The user's tool at `path` (config key `key`, e.g. rollout.tools[1]), checked; one UserError naming the key."""
    func = import_callable(path, key, "a tool: a function with type hints and a docstring")
    return checked_user_tool(func, tool_name(path), path, f"{key}={path}")


def checked_user_tool(func: Callable, name: str, path: str, where: str) -> UserTool:
    """`func` as the tool `name` (`path`: where it comes from), checked; one UserError starting with `where`."""
    if name in RESERVED_NAMES:
        raise UserError(
            f"{where}: the name '{name}' is a built-in tool's (or its tag's): {', '.join(RESERVED_NAMES)} are "
            "taken; rename the function (the tool's tag <name> is the last part of its import path)"
        )
    if inspect.isclass(func):
        raise UserError(f"{where}: a class; a tool is a function (or an object with a __call__ method)")
    call = type(func).__call__ if not inspect.isroutine(func) else None
    if inspect.iscoroutinefunction(func) or (call is not None and inspect.iscoroutinefunction(call)):
        raise UserError(f"{where}: an async function; a tool is a plain function (the rollout calls it directly)")
    signature = signature_of(func)
    if signature is None:
        raise UserError(f"{where}: its parameters cannot be read (a builtin?); wrap it in a function with type hints")
    try:
        hints = typing.get_type_hints(func.__call__ if call is not None else func)
    except Exception as err:  # noqa: BLE001 - a hint naming something undefined: its error, in one line
        raise UserError(f"{where}: its type hints cannot be read: {type(err).__name__}: {err}") from None
    parameters = []
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            kind = {p.VAR_POSITIONAL: f"*{p.name}", p.VAR_KEYWORD: f"**{p.name}"}.get(p.kind, f"{p.name}, /")
            raise UserError(
                f"{where}: a tool's arguments are its named parameters, so {kind} cannot be given; its signature is "
                f"{signature}"
            )
        if p.name not in hints:
            raise UserError(
                f"{where}: parameter '{p.name}' has no type hint; every parameter needs one ({SUPPORTED}): the call's "
                f"text is converted to it"
            )
        if not supported(hints[p.name]):
            raise UserError(
                f"{where}: parameter '{p.name}: {type_name(hints[p.name], python=True)}' is not a type a call's text "
                f"converts to; use {SUPPORTED}"
            )
        required = p.default is p.empty
        parameters.append(Parameter(p.name, hints[p.name], required, None if required else p.default))
    doc = inspect.getdoc(func)
    if not doc or not doc.strip():
        raise UserError(
            f"{where}: no docstring; a tool's docstring tells the policy what it does (its first line), and "
            "Google-style 'Args:' lines describe the parameters"
        )
    description, parameter_descriptions = describe(func, doc)
    return UserTool(name, path, func, tuple(parameters), description, parameter_descriptions)


def check_user_tools(paths: dict[str, str]) -> list[UserTool]:
    """Config key -> import path of each user tool: loaded and checked, and their names distinct."""
    tools, seen = [], {}
    for key, path in paths.items():
        tool = load_user_tool(path, key)
        if tool.name in seen:
            raise UserError(
                f"{key}={path}: the tag <{tool.name}> is already {seen[tool.name]}'s; two tools cannot share a name"
            )
        seen[tool.name] = f"{key}={path}"
        tools.append(tool)
    return tools


def describe(func: Callable, doc: str) -> tuple[str, dict[str, str]]:
    """The function's description and its parameters' (transformers' get_json_schema, which reads a Google-style
    docstring, where it can; else the docstring's first paragraph, the parameters undescribed)."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(func)["function"]
        described = {name: p.get("description", "") for name, p in schema["parameters"]["properties"].items()}
        return schema.get("description") or first_paragraph(doc), described
    except Exception:  # noqa: BLE001 - an argument without a description, a hint it does not know: ours is enough
        return first_paragraph(doc), {}


def first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


# ---- types -------------------------------------------------------------------------------------------------------


def optional_of(annotation) -> Any:
    """X for `X | None` / Optional[X], else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0]
    return None


def supported(annotation) -> bool:
    inner = optional_of(annotation)
    if inner is not None:
        return supported(inner)
    if annotation in SCALARS or annotation in CONTAINERS or annotation is Any:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list:
        return all(supported(a) for a in args)
    if origin is dict:
        return (not args or args[0] is str) and all(supported(a) for a in args[1:])
    return False


def type_name(annotation, python: bool = False) -> str:
    """JSON's name of a supported type (string, integer, array...), or Python's (python=True)."""
    if python:
        return getattr(annotation, "__name__", None) if isinstance(annotation, type) else str(annotation)
    inner = optional_of(annotation)
    if inner is not None:
        return f"{type_name(inner)} or null"
    base = typing.get_origin(annotation) or annotation
    return SCALARS.get(base) or CONTAINERS.get(base) or "any"


def from_text(text: str, annotation) -> Any:
    """The text of a one-parameter call as the parameter's type."""
    inner = optional_of(annotation)
    if inner is not None:
        return None if text.lower() in ("", "none", "null") else from_text(text, inner)
    if annotation is str or annotation is Any:
        return text
    if annotation in (int, float, bool):
        return from_json(text, annotation)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ToolArgumentError(f"{text[:40]!r} is not a JSON {type_name(annotation)}") from None
    return from_json(value, annotation)


def from_json(value: Any, annotation) -> Any:
    """A JSON value as the annotated type (a number written as a string is converted); ToolArgumentError if not."""
    inner = optional_of(annotation)
    if inner is not None:
        return None if value is None else from_json(value, inner)
    if annotation is Any:
        return value
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return json.dumps(value)
    elif annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
            return value.strip().lower() in TRUE
    elif annotation in (int, float):
        number = value
        if isinstance(value, str):
            try:
                number = float(value.strip().replace(",", ""))
            except ValueError:
                number = None
        if isinstance(number, int | float) and not isinstance(number, bool):
            if annotation is float:
                return float(number)
            if float(number).is_integer():
                return int(number)
    else:
        origin, args = typing.get_origin(annotation) or annotation, typing.get_args(annotation)
        if origin is list and isinstance(value, list):
            return [from_json(item, args[0]) for item in value] if args else value
        if origin is dict and isinstance(value, dict):
            return {k: from_json(v, args[1]) for k, v in value.items()} if len(args) == 2 else value
    raise ToolArgumentError(f"{shown} is not {article(type_name(annotation))}")


def article(name: str) -> str:
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def output_text(value: Any) -> str:
    """What the policy reads of a returned value."""
    if value is None:
        return "(no output)"
    if isinstance(value, str):
        return value
    if isinstance(value, list | dict | tuple):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("rollout.describe_tools",),
        lambda cfg: cfg.rollout.environment is not None or any(is_import_path(tool) for tool in cfg.rollout.tools),
        "to describe your own tools (import paths in rollout.tools) or your environment's methods",
        lambda cfg: f"rollout.tools={list(cfg.rollout.tools)} has none of yours and there is no rollout.environment",
        "add your tool to rollout.tools",
    ),
)
