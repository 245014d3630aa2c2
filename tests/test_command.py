"""The `grpo-exp` console script: `grpo-exp <command> ARGS` is `python -m grpo_exp.<command> ARGS`."""

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_exp.cli import COMMANDS
from tests.helpers.cli import run_command

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, check=False)


def grpo_exp(*args: str) -> subprocess.CompletedProcess:
    assert GRPO_EXP.is_file(), f"{GRPO_EXP} is missing: install the package (make install)"
    return run(str(GRPO_EXP), *args)


def test_help_lists_the_commands():
    result = grpo_exp("--help")
    assert result.returncode == 0
    for name, (module, _) in COMMANDS.items():
        assert f"  {name} " in result.stdout and f"python -m {module}" in result.stdout
    assert set(COMMANDS) == {"train", "evaluate", "compare", "diagnose", "probe", "serve"}


@pytest.mark.parametrize("args,code", [((), 2), (("bogus",), 2)])
def test_no_or_an_unknown_command_is_a_usage_error(args, code):
    result = grpo_exp(*args)
    assert result.returncode == code
    assert "usage: grpo-exp {train,evaluate,compare,diagnose,probe,serve}" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "command,args",
    [
        ("train", ["--help"]),  # Hydra's help of the app: the config groups and the composed config
        ("train", ["--cfg", "job", "reward=math+format", "trainer.beta=0.04"]),
        ("train", ["--cfg", "job", "reward=math+nope"]),  # the same error, the same exit status
        ("evaluate", ["--help"]),
        ("compare", ["--help"]),
        ("compare", ["/no/such/multirun"]),
        ("probe", ["--help"]),
    ],
)
def test_a_command_is_its_module_run_with_python_dash_m(command, args):
    """Both started warm (tests/helpers/warm.py runs the console script as its entry point would); the console
    script itself, cold, in the other tests here."""
    mine = run_command([GRPO_EXP, command, *args], timeout=300)
    theirs = run_command([sys.executable, "-m", COMMANDS[command][0], *args], timeout=300)
    assert (mine.returncode, mine.stdout) == (theirs.returncode, theirs.stdout)
    assert mine.stderr.splitlines()[-3:] == theirs.stderr.splitlines()[-3:]
    assert mine.stdout or mine.stderr


def test_a_multirun_flag_and_a_config_dir_reach_hydra(tmp_path):
    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "flat.yaml").write_text(
        "defaults:\n  - /reward_component/custom@components.flat\n  - _self_\n"
        "components:\n  flat:\n    weight: 2.0\n    function: user_rewards:constant\n"
    )
    result = grpo_exp("train", "--config-dir", str(tmp_path), "--info", "searchpath", "reward=math+flat")
    assert result.returncode == 0, result.stderr
    assert f"file://{tmp_path}" in result.stdout and "command-line" in result.stdout
    # -m with --cfg is refused by Hydra itself: the flag got there
    result = grpo_exp("train", "-m", "--cfg", "job")
    assert result.returncode != 0 and "Only one of --run, --multirun" in result.stderr


# What a training loads that answering a command's arguments needs not: torch and the model libraries, reasoning-gym's
# tasks, math-verify (sympy). Every reward module is imported to find the components, so none may import them at its
# top; each command imports them after its arguments are parsed.
MODEL_LIBRARIES = ("torch", "transformers", "trl", "datasets", "reasoning_gym", "math_verify", "sympy", "vllm")
# Printed at exit: a command's __main__ ends the process itself after the atexit handlers (grpo_exp.process_exit).
LOADED_AFTER = (
    "import atexit, runpy, sys\n"
    f"atexit.register(lambda: print('loaded:', sorted(m for m in {MODEL_LIBRARIES!r} if m in sys.modules)))\n"
    "module, sys.argv = sys.argv[1], sys.argv[1:]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


@pytest.mark.parametrize(
    "command,args,printed",
    [
        (
            "train",
            ["--cfg", "job", "reward=math+format+judge+confidence+selfverify+repetition", "scorer=genrm"],
            "judge:",
        ),
        ("train", ["--help"], "Config groups (choose with group="),
        ("train", ["trainer.bta=0.1"], "trainer.bta"),  # refused before anything is loaded
        *[(name, ["--help"], "usage:") for name in COMMANDS if name != "train"],
    ],
)
def test_help_a_composed_config_and_a_refused_key_load_no_model_library(command, args, printed):
    """`--help`, `--cfg job` and a mistyped key answer in under 2 s (0.45 s for `--cfg job` against 6.8 s with the
    imports, 2 Xeon cores): without torch and TRL, which every built-in reward component's module, and every command
    past its arguments, leaves to the work."""
    result = run(sys.executable, "-c", LOADED_AFTER, COMMANDS[command][0], *args)
    assert printed in result.stdout + result.stderr, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "loaded: []"
