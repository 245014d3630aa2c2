"""probe.before_training: the reward probe (grpo_exp.probe) on this run's own rewards before its first step: warn
(each finding logged, probe.json in the run directory, `probe_findings` in summary.json) | stop (no training while
there is a finding) | off. Every process probes alike (the rewards are the run's), so a stop stops them all."""

import logging
from pathlib import Path

from grpo_exp.errors import UserError
from grpo_exp.probe.battery import finding_lines, probe_heldout
from grpo_exp.run.distributed import is_main_process
from grpo_exp.schema import AlarmAction

log = logging.getLogger(__name__)


def probe_first(spec, parts, tokenizer, heldout, run_dir: Path) -> list[str] | None:
    """The findings (one line each), or None with probe.before_training=off."""
    action = AlarmAction(spec.cfg.probe.before_training)
    if action is AlarmAction.off:
        return None
    result = probe_heldout(parts.reward_funcs, spec.reward_weights, heldout, tokenizer, parts.verifier, spec.cfg.probe)
    if is_main_process():
        result.write(run_dir)
    lines = finding_lines(result)
    for line in lines:
        log.warning("Reward probe: %s", line)
    if lines and action is AlarmAction.stop:
        raise UserError(
            f"probe.before_training=stop: the reward probe found {len(lines)} way(s) to be paid without the answer "
            f"({run_dir / 'probe.json'}): " + "; ".join(lines)
        )
    if not lines:
        log.info("Reward probe: no attack paid beyond a wrong answer (%d problems)", result.problems)
    return lines
