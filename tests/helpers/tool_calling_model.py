"""Tiny models taught in a few seconds to open their answers with one fixed tool call, so that a tool-calling loop
really parses a call and runs a tool: TRL's own (a Qwen3 chat template on the tiny model's tokenizer) and
grpo_exp's multi-turn rollout (the calculator preset). They learn nothing else."""

import shutil
from pathlib import Path

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from support.config import compose_config
from support.models import write_tiny_model

QWEN3_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"


def taught_tool_caller(directory: Path, prompts: list[list[dict]], tools: list, call: str) -> Path:
    """Save in `directory` the tiny model (Qwen3's template) taught to answer each of `prompts` (chat messages, with
    `tools` described) with `call` (e.g. '<tool_call>\\n{"name": "probe", "arguments": {"digit": 7}}\\n</tool_call>'),
    then its end of turn."""
    write_tiny_model(directory, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = QWEN3_TEMPLATE.read_text(encoding="utf-8")
    texts = [
        tokenizer.apply_chat_template(prompt, tools=tools, tokenize=False, add_generation_prompt=True)
        for prompt in prompts
    ]
    return _taught(directory, tokenizer, texts, f"{call}<|im_end|>")


def taught_calculator_caller(directory: Path, source: Path, overrides: list[str], problems: int = 16) -> Path:
    """Save in `directory` the model saved in `source` (a tiny one), taught to open each of the first `problems`
    training prompts of the run `overrides` composes (its multi-turn rollout's messages: the calculator preset's
    system message and tools) with a calculator call, '<calc>1+1</calc>'. Its trajectories then go on after the
    tool's answer, which a random tiny model's never do."""
    from grpo_exp.data import load_splits
    from grpo_exp.rollout.multiturn import MultiTurnRollout

    shutil.copytree(source, directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    cfg = compose_config(overrides)
    train, _ = load_splits(cfg.dataset)
    rollout = MultiTurnRollout(cfg.rollout)
    texts = [
        tokenizer.apply_chat_template(rollout.messages(row["prompt"]), tokenize=False, add_generation_prompt=True)
        for row in train.select(range(problems))
    ]
    return _taught(directory, tokenizer, texts, "<calc>1+1</calc>")


def _taught(
    directory: Path, tokenizer, texts: list[str], answer: str, max_steps: int = 300, taught_loss: float = 0.02
) -> Path:
    """The model saved in `directory` trained to write `answer` after each of `texts`, saved there with `tokenizer`.
    Only the answer's positions are scored (logits_to_keep): a few seconds on a CPU. The gradient is clipped: at
    Adam's 1e-2 unclipped the loss leapt from 0.19 to 2.4 at the last of 100 steps on an AVX2-only CPU, leaving a
    model that never called (P(call) 3e-7, CI at c365340), while AVX-512 kernels had ended well. It trains until the
    answer's mean token loss is below `taught_loss` and refuses a model that did not get there."""
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(directory)
    batch = tokenizer([text + answer for text in texts], return_tensors="pt", padding=True, add_special_tokens=False)
    width = len(tokenizer(answer, add_special_tokens=False)["input_ids"])
    target = batch["input_ids"][:, -width:]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(max_steps):
        logits = model(**batch, logits_to_keep=width + 1).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
        if loss.item() < taught_loss:
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    else:
        raise AssertionError(
            f"the tiny model was not taught {answer!r}: its loss is {loss.item():.3f} after {max_steps} steps"
        )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
