"""A tiny model with a chat template that supports tool calling (TRL's own Qwen3 template on the tiny model's
tokenizer), taught in a few seconds to answer its prompts with one fixed tool call, so that TRL's tool-calling loop
really parses a call and runs a method. It learns nothing else."""

from pathlib import Path

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from support.models import write_tiny_model

QWEN3_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"


def taught_tool_caller(
    directory: Path, prompts: list[list[dict]], tools: list, call: str, steps: int = 100, lr: float = 1e-2
) -> Path:
    """Save in `directory` the tiny model (Qwen3's template) taught to answer each of `prompts` (chat messages, with
    `tools` described) with `call` (e.g. '<tool_call>\\n{"name": "probe", "arguments": {"digit": 7}}\\n</tool_call>'),
    then its end of turn. Only the answer's positions are scored (logits_to_keep): a few seconds on a CPU."""
    write_tiny_model(directory, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = QWEN3_TEMPLATE.read_text(encoding="utf-8")
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(directory)
    answer = f"{call}<|im_end|>"
    texts = [
        tokenizer.apply_chat_template(prompt, tools=tools, tokenize=False, add_generation_prompt=True) + answer
        for prompt in prompts
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    width = len(tokenizer(answer, add_special_tokens=False)["input_ids"])
    target = batch["input_ids"][:, -width:]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(0)
    for _ in range(steps):
        logits = model(**batch, logits_to_keep=width + 1).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
