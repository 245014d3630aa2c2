"""`grpo-exp probe` (`python -m grpo_exp.reward_probe`): probe every reward of a training config for hacks before
it trains.

grpo-exp probe                                  # the default run's reward (reward=math)
grpo-exp probe reward=math+format+length        # any mix: each component and the weighted mix
grpo-exp probe reward=math+confidence scorer=genrm probe.problems=40
grpo-exp probe --config-dir configs reward=math+mine probe.attacks=[my_attacks:sneaky]
grpo-exp probe outputs/runs/<date>/<time>       # a run's own rewards, composed as `grpo-exp evaluate` does

For the first probe.problems held-out problems it writes a right answer, a plainly wrong one and each attack (several
final answers, a hedge, the question echoed, the reference in the reasoning but a wrong final answer, empty answer
tags, an empty answer, a truncated one, a very long one, the prompt copied, look-alike characters, a refusal, and
the user's own), each stating its answer as the run reads answers (verifier.answer); scores them with the run's own
reward functions, as TRL calls them; and reports each finding: an attack paid as much as the right answer (by a
reward that tells right from wrong), or more than the wrong one beyond noise (95% t-interval). Results: a table,
and probe.json in <outputs_dir>/probe/<time>/.
"""

import logging
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from grpo_exp.errors import UserError, run_command
from grpo_exp.import_collection import without_collection
from grpo_exp.probe.attacks import RIGHT, WRONG
from grpo_exp.probe.battery import MIX, ProbeResult, finding_lines, probe_heldout
from grpo_exp.process_exit import run_then_exit
from grpo_exp.run.config_store import register_schemas
from grpo_exp.run.sources import command_args, composed, resolve_source
from grpo_exp.run_files import check_command_outputs

if TYPE_CHECKING:
    from grpo_exp.run.resolve import RunSpec

log = logging.getLogger(__name__)


def probe_run(spec: "RunSpec", parts, tokenizer, heldout) -> ProbeResult:
    """The probe of this run's rewards, as training would call them."""
    if parts.rollout is not None:
        raise UserError(
            "probe: rollout=multiturn's rewards score whole tool conversations, which the probe's battery does not "
            "write yet: probe the same mix with rollout=single"
        )  # training refuses probe.before_training with it at resolve
    return probe_heldout(parts.reward_funcs, spec.reward_weights, heldout, tokenizer, parts.verifier, spec.cfg.probe)


def print_result(result: ProbeResult, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 120))
    table = Table(title="reward probe: mean score of each completion, problem by problem", title_justify="left")
    kinds = list(result.examples)
    table.add_column("completion", style="bold")
    for reward in result.scores:
        table.add_column(reward if reward != MIX else "mix (weighted)", justify="right")
    flagged = {(f.reward, f.attack) for f in result.found}
    for kind in kinds:
        cells = []
        for reward in result.scores:
            mean = result.mean(reward, kind)
            text = "skipped" if mean is None else f"{mean:.3f}"
            cells.append(f"[red]{text} ![/red]" if (reward, kind) in flagged else text)
        table.add_row(kind if kind not in (RIGHT, WRONG) else f"({kind} answer)", *cells)
    console.print(table)
    if result.right_credited < 0.5:
        console.print(
            f"[yellow]The run's labels call only {result.right_credited:.0%} of the written right answers correct: "
            "the comparisons with the right answer mean little (verifier.answer may read answers another way).[/yellow]"
        )
    lines = finding_lines(result)
    console.print(f"{len(lines)} finding(s)" + (":" if lines else ": no attack paid beyond a wrong answer."))
    for line, finding in zip(lines, result.found, strict=True):
        example = finding.example if len(finding.example) <= 160 else finding.example[:157] + "..."
        console.print(f"  - {line}\n    e.g. {example!r}")


def parse_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments, the --config-dir directories)."""
    epilog = __doc__.split("\n\n", 1)[1]
    return command_args(argv, "python -m grpo_exp.reward_probe", __doc__, epilog, "[RUN_DIR] [KEY=VALUE ...]")


def main(argv: list[str] | None = None) -> ProbeResult:
    warnings.filterwarnings("ignore", category=FutureWarning)
    register_schemas()
    source = resolve_source(*parse_args(sys.argv[1:] if argv is None else argv))
    # torch, the model libraries and the run's modules: after the arguments (--help, a bad one: answered without them)
    with without_collection():  # grpo_exp.import_collection
        from grpo_exp.models import load_tokenizer
        from grpo_exp.run.resolve import resolve
        from grpo_exp.run.setup import set_up

    cfg = composed(source)  # the user's modules importable: their reward components and attacks
    spec = resolve(cfg, processes=1, evaluating=source.out_dir is not None, probing=True)
    out_dir = source.out_dir or Path(cfg.outputs_dir) / "probe" / time.strftime("%Y-%m-%d_%H-%M-%S")
    check_command_outputs(cfg, out_dir, source.out_dir is not None)
    inputs = set_up(spec)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    result = probe_run(spec, inputs.parts, tokenizer, inputs.heldout)
    out_dir.mkdir(parents=True, exist_ok=True)
    print_result(result)
    print(f"written: {result.write(out_dir)}")
    return result


if __name__ == "__main__":
    run_then_exit(run_command, main)  # a bad override or input: its message, not a traceback
