"""`grpo-exp evaluate` through vLLM, for a run that generated with it (generation=vllm_colocate / vllm_server): the
held-out answers come from an engine of the evaluation's own, on the model being evaluated, in the dtype the run
sampled in, as the trainer's own validations did (grpo_exp.trainer.trl_surface.policy_for_generation). A server run
is evaluated the same way: the server holds whatever the trainer last sent it, not the checkpoint asked for."""

import copy
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from grpo_exp.rollout.vllm_turns import ColocatedTurns, answered_by
from grpo_exp.trainer.vllm_engine import check_vllm_installed, prepare_engine_environment


def generates_with_vllm(cfg) -> bool:
    return bool(cfg.trainer.extra.get("use_vllm"))


@contextmanager
def answered_through_vllm(cfg, model, tokenizer):
    """Within it, held-out answers (grpo_exp.run.heldout.answer) come from a vLLM engine on `model`; yields what
    answers ("vLLM (float32)"), or None where the run did not generate with vLLM (nothing changes)."""
    if not generates_with_vllm(cfg):
        yield None
        return
    check_vllm_installed()
    from vllm import LLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    prepare_engine_environment(device)
    dtype = "bfloat16" if cfg.trainer.bfloat16_generation else str(model.dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory(prefix="grpo_exp_vllm_eval_") as tmp:
        llm = LLM(
            model=str(engine_directory(model, tokenizer, Path(tmp))),
            dtype=dtype,
            seed=cfg.trainer.seed,
            enforce_eager=device == "cpu",
            gpu_memory_utilization=cfg.trainer.extra.get("vllm_gpu_memory_utilization", 0.3),
            logprobs_mode="processed_logprobs",
        )
        try:
            with answered_by(ColocatedTurns(llm)):
                yield f"vLLM ({dtype})"
        finally:
            del llm


def engine_directory(model, tokenizer, scratch: Path) -> Path:
    """A directory vLLM loads `model` from: the model's own when it is a local checkpoint of exactly these weights,
    else the weights saved to `scratch` (a LoRA adapter merged into a copy, as TRL syncs it to vLLM)."""
    own = Path(model.name_or_path)
    adapter = hasattr(model, "peft_config")
    if not adapter and (own / "config.json").is_file() and any(own.glob("*.safetensors")):
        return own
    weights = copy.deepcopy(model).merge_and_unload() if adapter else model
    weights.save_pretrained(scratch)
    tokenizer.save_pretrained(scratch)
    return scratch
