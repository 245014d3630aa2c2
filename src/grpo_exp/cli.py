"""`grpo-exp <command> ...`: the console script; `grpo-exp train ...` is `python -m grpo_exp.train ...`.

Each command runs its module as `python -m` does (runpy, as __main__, sys.argv[0] the module's file), with the
remaining arguments untouched (Hydra overrides, -m, --config-dir, --cfg, --help), and the current directory first
on sys.path, where `python -m` puts it (the user's reward modules import from there).
"""

import os
import runpy
import sys

COMMANDS = {
    "train": ("grpo_exp.train", "GRPO training: Hydra overrides, -m sweeps, --config-dir DIR"),
    "evaluate": ("grpo_exp.evaluate", "held-out accuracy, pass@k, maj@k of a run, checkpoint or model"),
    "compare": ("grpo_exp.compare", "runs side by side: a multirun directory or run directories"),
    "diagnose": ("grpo_exp.diagnose", "why a run did (not) learn: findings from a run directory's records"),
    "probe": ("grpo_exp.reward_probe", "every reward of a config on adversarial completions, before training"),
    "serve": ("grpo_exp.serve", "a vLLM server of a model for generation=vllm_server, the judge and the scorer"),
}

USAGE = "usage: grpo-exp {" + ",".join(COMMANDS) + "} [ARGS ...]"


def help_text() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what} (= python -m {module})" for name, (module, what) in COMMANDS.items()]
    return "\n".join(
        [
            USAGE,
            "",
            "GRPO experiments on top of TRL, configured by Hydra.",
            "",
            "commands:",
            *lines,
            "",
            "`grpo-exp <command> --help` shows a command's own help. Examples:",
            "  grpo-exp train reward=math+format trainer.beta=0.04",
            "  grpo-exp train --config-dir my_configs reward=math+mine   # your own reward/mine.yaml",
            "  grpo-exp train -m trainer.num_generations=4,8",
            "  grpo-exp evaluate outputs/runs/<date>/<time>",
            "  grpo-exp compare outputs/multirun/<date>/<time>",
            "  grpo-exp diagnose outputs/runs/<date>/<time>",
            "  grpo-exp probe reward=math+format+length",
            "  grpo-exp serve --port 8000   # then: grpo-exp train generation=vllm_server",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(help_text())
        raise SystemExit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"{USAGE}\ngrpo-exp: unknown command '{command}'; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        raise SystemExit(2)
    module = COMMANDS[command][0]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    sys.argv = [sys.argv[0], *rest]  # runpy's alter_sys then puts the module's file first, as `python -m`
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
