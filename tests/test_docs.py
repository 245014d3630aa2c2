"""Documentation that cannot drift from the code.

Every command line in README.md and docs/*.md (`python -m grpo_exp.X ...`, `grpo-exp X ...`, also inside
`accelerate launch ... -m grpo_exp.train ...`, continuations joined) is checked: a training command's overrides are
composed with Hydra (a `-m` sweep once per value of each swept key), evaluate's and probe's arguments go through
their own argparse, compare's and diagnose's flags must be flags their parsers define. What cannot be checked
offline is listed in SKIPPED with its reason, so nothing is skipped silently. And the code map (docs/code-map.md)
is the one support/code_map.py generates from the tree.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from grpo_exp.paths import CONF_DIR, REPO_ROOT
from support import code_map, config_reference
from support.config import register_schemas

# the code map is the modules' docstrings (checked against the tree below), not command lines to run
PAGES = [REPO_ROOT / "README.md", *sorted(p for p in (REPO_ROOT / "docs").glob("*.md") if p.name != "code-map.md")]
COMMANDS = {"train": "train", "evaluate": "evaluate", "compare": "compare", "diagnose": "diagnose"}
COMMANDS["probe"] = "reward_probe"
COMMANDS["serve"] = "serve"
MODULES = {f"grpo_exp.{m}": m for m in ("train", "evaluate", "compare", "diagnose", "reward_probe", "serve")}

# A command line (as written, whitespace collapsed) -> why it is not checked. Placeholders, and the user's own
# config directories that the repository does not hold, cannot compose offline.
USERS_OWN = "the user's own config directory (their project's configs/, reward/mine.yaml ...), not in the repository"
PLACEHOLDER = "a placeholder (ARGS, ..., <...>) stands for the reader's own arguments"
WORKED_EXAMPLE = "docs/adding-a-builtin.md's worked example: the built-in that the page adds, not in the repository"
SKIPPED: dict[str, str] = {
    "python -m grpo_exp.train reward=math+brevity reward.components.brevity.max_words=50": WORKED_EXAMPLE,
    "python -m grpo_exp.train +experiment=gridworld": WORKED_EXAMPLE,
    "grpo-exp train ARGS": PLACEHOLDER,
    "python -m grpo_exp.train ARGS": PLACEHOLDER,
    "grpo-exp train|evaluate|compare ARGS": PLACEHOLDER,
    "python -m grpo_exp.train|evaluate|compare ARGS": PLACEHOLDER,
    "python -m grpo_exp.train +experiment=p_yes_loop scorer.model=<a selfverify run dir>": PLACEHOLDER,
    "python -m grpo_exp.train -m hydra/launcher=slurm hydra.launcher.partition=gpu trainer.resume=auto ...": (
        PLACEHOLDER
    ),
    "python -m grpo_exp.train -m hydra/launcher=slurm_multigpu hydra.launcher.partition=gpu ...": PLACEHOLDER,
    "accelerate launch --config_file accelerate_configs/ddp.yaml -m grpo_exp.train ...": PLACEHOLDER,
    "accelerate launch --config_file accelerate_configs/zero3.yaml -m grpo_exp.train ...": PLACEHOLDER,
    "accelerate launch --config_file accelerate_configs/fsdp.yaml -m grpo_exp.train ...": PLACEHOLDER,
    "grpo-exp train --config-dir configs reward=math+mine": USERS_OWN,
    "grpo-exp train --config-dir configs -m reward=math,math+mine": USERS_OWN,
    "grpo-exp train --config-dir configs -m reward=math+mine reward.components.mine.weight=0.5,1": USERS_OWN,
    'python -m grpo_exp.train "hydra.searchpath=[file://$PWD/configs]" reward=math+mine': USERS_OWN,
    "grpo-exp train reward=math+mine probe.before_training=warn": USERS_OWN + " (its reward/mine.yaml)",
    "grpo-exp train --config-dir configs reward=math+judge judge/rubric=mine": USERS_OWN,
    "grpo-exp probe --config-dir configs reward=math+mine probe.attacks=[my_attacks:sneaky]": USERS_OWN,
    "grpo-exp train --config-dir configs +experiment=words": USERS_OWN,
    "grpo-exp train --config-dir configs +experiment=x": USERS_OWN,
    "grpo-exp train --config-dir configs dataset=mine": USERS_OWN,
    "grpo-exp train --config-dir configs -m algorithm=grpo,sign": USERS_OWN,
}


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    cwd: Path  # where a preceding `cd` in its block left the reader

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _logical_lines(lines: list[tuple[int, str]]):
    """(first line number, text) with `\\` continuations joined."""
    buffer, start = "", None
    for number, text in lines:
        if start is None:
            start = number
        stripped = text.rstrip()
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        yield start, buffer + text
        buffer, start = "", None
    if buffer:
        yield start, buffer


COMMAND_START = re.compile(r"(python3? -m grpo_exp\.\w+|grpo-exp \w+|accelerate launch .*-m grpo_exp\.\w+)")


def find_commands() -> list[Command]:
    found = []
    for page in PAGES:
        name = page.relative_to(REPO_ROOT).as_posix()
        lines = page.read_text(encoding="utf-8").splitlines()
        fence, block, cwd = None, [], REPO_ROOT
        for number, text in enumerate(lines, start=1):
            if text.lstrip().startswith("```"):
                if fence is None:
                    fence, block, cwd = text.strip()[3:], [], REPO_ROOT
                else:
                    if fence in ("", "bash", "sh", "shell", "console"):
                        for start, logical in _logical_lines(block):
                            code = logical.split(" #", 1)[0].strip() if not logical.lstrip().startswith("#") else ""
                            if code.startswith("cd "):
                                cwd = (cwd / code.split()[1]).resolve()
                            elif match := COMMAND_START.search(code):
                                prefix = code[: match.start()]
                                command = code if _is_prefix(prefix) else code[match.start() :]
                                found.append(Command(name, start, " ".join(command.split()), cwd))
                    fence = None
                continue
            if fence is not None:
                block.append((number, text))
                continue
            for span in re.findall(r"`([^`]+)`", text):
                if COMMAND_START.match(span.strip()):
                    found.append(Command(name, number, " ".join(span.split()), REPO_ROOT))
    return found


def _is_prefix(text: str) -> bool:
    """Environment variables set for the command (`GRPO_EXP_X=1 python -m ...`)."""
    return all(re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", word) for word in text.split())


ALL = find_commands()


def _tokens(command: Command) -> tuple[str, list[str]]:
    """(the command: train, evaluate, ...; its arguments)."""
    words = shlex.split(command.text.replace("$PWD", str(command.cwd)))
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words) and words[i + 1] in MODULES:
            return MODULES[words[i + 1]], words[i + 2 :]
        if word == "grpo-exp" and i + 1 < len(words):
            return COMMANDS.get(words[i + 1], words[i + 1]), words[i + 2 :]
    raise AssertionError(f"{command}: no grpo_exp command found in it")


def _config_dir(directory: str, cwd: Path) -> Path:
    path = (cwd / directory).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"--config-dir {directory}: no such directory (from {cwd})")
    return path


COMPOSED: set[tuple[str, ...]] = set()  # compositions already made (several pages show the same command)


def _compose(overrides: list[str], config_dirs: list[Path]) -> None:
    from grpo_exp.deprecated import translate_overrides

    key = (*overrides, "|", *map(str, config_dirs))
    if key in COMPOSED:
        return

    searchpath = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in config_dirs)}]"] if config_dirs else []
    compose("config", overrides=translate_overrides(overrides) + searchpath)
    COMPOSED.add(key)


def _sweep(overrides: list[str]) -> list[list[str]]:
    """A -m sweep's compositions: each swept value once, the other keys at their first value (every value a sweep
    names is composed; combinations add nothing to whether a value composes, only time)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for override in parsed:
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    firsts = [values[0] for values in choices]
    variants = [firsts[:i] + [value] + firsts[i + 1 :] for i, values in enumerate(choices) for value in values[1:]]
    return [firsts, *variants]


def check_train(args: list[str], cwd: Path) -> None:
    multirun, config_dirs, overrides = False, [], []
    words = iter(args)
    for word in words:
        if word in ("-m", "--multirun"):
            multirun = True
        elif word in ("--config-dir", "-cd"):
            config_dirs.append(_config_dir(next(words), cwd))
        elif word.startswith("--config-dir="):
            config_dirs.append(_config_dir(word.split("=", 1)[1], cwd))
        elif word in ("--cfg", "-c"):
            next(words)
        elif word in ("--help", "-h", "--hydra-help", "--info", "--resolve"):
            continue
        elif word.startswith("-"):
            raise AssertionError(f"an option Hydra's command line does not have: {word}")
        else:
            overrides.append(word)
    for composition in _sweep(overrides) if multirun else [overrides]:
        _compose(composition, config_dirs)


def check_evaluate_or_probe(module: str, args: list[str], cwd: Path) -> None:
    import importlib

    parsed, config_dirs = importlib.import_module(f"grpo_exp.{module}").parse_args(args)
    if parsed and "=" in parsed[0]:  # no run directory: a plain config, composed with these overrides
        _compose(parsed, [_config_dir(d, cwd) for d in config_dirs])


def check_flags(module: str, args: list[str]) -> None:
    """compare's and diagnose's parsers are built inside main(): their flags, read from its source (not imported:
    the modules import torch)."""
    tree = ast.parse((REPO_ROOT / "src" / "grpo_exp" / f"{module}.py").read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    source = ast.unparse(main).replace("'", '"')
    defined = set(re.findall(r'"(--?[\w-]+)"', source)) | {"-h", "--help"}
    unknown = [w.split("=", 1)[0] for w in args if w.startswith("-") and w.split("=", 1)[0] not in defined]
    assert not unknown, f"flags {module}'s parser does not define: {unknown} (it defines {sorted(defined)})"


def check_serve(args: list[str]) -> None:
    """grpo-exp serve's arguments through its own argparse (an unknown flag before `--` exits)."""
    from grpo_exp.serve import parse

    try:
        parse(args)
    except SystemExit as exit_:
        raise AssertionError(f"grpo-exp serve does not take {args}") from exit_


def check(command: Command) -> None:
    module, args = _tokens(command)
    if module == "train":
        check_train(args, command.cwd)
    elif module in ("evaluate", "reward_probe"):
        check_evaluate_or_probe(module, args, command.cwd)
    elif module in ("compare", "diagnose"):
        check_flags(module, args)
    elif module == "serve":
        check_serve([arg for arg in args if arg != "&"])
    else:
        raise AssertionError(f"no such command: {module} (grpo-exp's are {', '.join(COMMANDS)})")


def test_the_docs_have_command_lines_to_check():
    assert len(ALL) > 50, [str(c) for c in ALL]


def test_every_documented_command_line_composes():
    failures = []
    register_schemas()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        _check_all(failures)
    assert not failures, f"{len(failures)} documented command lines no longer compose:\n" + "\n".join(failures)


def _check_all(failures: list[str]) -> None:
    # a command line the docs repeat (151 lines, 114 different) is composed once, and a failure names every place
    places: dict[tuple[str, Path], list[Command]] = {}
    for command in ALL:
        if command.text not in SKIPPED:
            places.setdefault((command.text, command.cwd), []).append(command)
    for first, *others in places.values():
        try:
            check(first)
        except SystemExit as err:  # argparse refused it
            failures += [f"{command}\n    argparse refused it (exit {err.code})" for command in (first, *others)]
        except Exception as err:  # noqa: BLE001 - every failure reported, with its page and line
            message = " ".join(str(err).split())[:400]
            failures += [f"{command}\n    {type(err).__name__}: {message}" for command in (first, *others)]


def test_the_skip_list_names_only_command_lines_the_docs_still_have():
    documented = {c.text for c in ALL}
    stale = [text for text in SKIPPED if text not in documented]
    assert not stale, f"SKIPPED lists command lines no page has any more (remove them): {stale}"


def test_the_code_map_is_the_tree():
    page = code_map.PAGE.read_text(encoding="utf-8")
    listed, tree = set(code_map.listed(page)), set(code_map.modules())
    missing, gone = sorted(tree - listed), sorted(listed - tree)
    assert not missing and not gone, (
        f"docs/code-map.md and src/grpo_exp/ differ: modules to add to the map: {missing or 'none'}; "
        f"modules the map names that no longer exist: {gone or 'none'}. Run `python -m support.code_map`."
    )
    assert page == code_map.render(), (
        "docs/code-map.md is not what `python -m support.code_map` writes from the modules' docstrings "
        "(a docstring or the header changed): run it and commit the page."
    )


@pytest.mark.parametrize("claim", ["trainer/seam.py", "trainer/trl_surface.py", "tests/test_import_layers.py"])
def test_the_code_map_states_the_boundaries_tests_enforce(claim):
    assert claim in code_map.PAGE.read_text(encoding="utf-8")


def test_the_config_references_option_lists_are_conf_and_the_registry():
    """Each group's options on docs/config-reference.md are conf/<group>/'s files (the reward components: their
    registry's), as support/config_reference.py writes them."""
    page = config_reference.PAGE.read_text(encoding="utf-8")
    assert page == config_reference.render(page), "docs/config-reference.md: run `python -m support.config_reference`"
    assert "`task_score`" in page and "`vllm_async`" in page
