"""Which positions TRL's fused LM head scores in grpo_exp's loss forward. TRL computes the log-softmax over the whole
vocabulary only at the positions with a label where Triton runs its kernel (CUDA, XPU), and at every position
elsewhere, so that a compiled kernel (Neuron's) keeps one tile shape. On CPU nothing is compiled, and every prompt
position (a label of -100) is scored, and differentiated, for nothing: about 100 of a packed group's ~340 tokens on
the default run, most of a test's tiny run. Inside `labelled_positions_only`, TRL takes its own compact path on CPU
too: the labelled positions gathered, scored and scattered back, the rest exactly 0 as before. Outside it (a bare
GRPOTrainer in the same process), TRL decides as it always does. The name is declared in
grpo_exp.trainer.trl_contract."""

import contextlib
import contextvars
import importlib
from collections.abc import Iterator

import torch

from grpo_exp.trainer.trl_contract import TRL_LM_HEAD_COMPACT

_ON_CPU_TOO = contextvars.ContextVar("grpo_exp_lm_head_compact_on_cpu", default=False)


@contextlib.contextmanager
def labelled_positions_only() -> Iterator[None]:
    """TRL's fused LM head, called inside, scores only the labelled positions on CPU, as it does on CUDA."""
    _answer_for_cpu_too()
    token = _ON_CPU_TOO.set(True)
    try:
        yield
    finally:
        _ON_CPU_TOO.reset(token)


def _answer_for_cpu_too() -> None:
    """Wrap TRL's decision once per process: yes on CPU inside `labelled_positions_only`, TRL's own answer else."""
    module_name, name = TRL_LM_HEAD_COMPACT
    module = importlib.import_module(module_name)
    trls = getattr(module, name)
    if getattr(trls, "grpo_exp_wrapped", False):
        return

    def compact(device: torch.device) -> bool:
        return (device.type == "cpu" and _ON_CPU_TOO.get()) or trls(device)

    compact.grpo_exp_wrapped = True
    setattr(module, name, compact)
