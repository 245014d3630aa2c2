"""Which tool-call protocol does the embedded model follow? `python -m benchmarks.tool_protocol` (`make bench`).

The untrained SmolLM2-135M-Instruct, sampled at temperature 1 (as in training) on arithmetic problems of the
calculator preset: the share of completions that hold a complete, well-formed call, for
- TRL's JSON tool call (Qwen's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), shown once;
- grpo_exp's calculator tag `<calc>...</calc>`, described only (a system message, no demonstration);
- the calculator tag with the system message and one demonstration exchange (rollout=multiturn's default);
- grpo_exp's python block (```python ... ```) with one demonstration.
The rollout=multiturn protocol is the one the model actually follows.
"""

import json
import re

import torch

from grpo_exp.data import load_splits
from grpo_exp.generation import generate_completions
from grpo_exp.models import load_model, load_tokenizer
from support.config import resolved_config

PROBLEMS, SAMPLES = 8, 4
DEMO_QUESTION = "Calculate 12 * 34.\nPut your final answer within \\boxed{}."
CALC_SYSTEM = (
    "You can use a calculator: write <calc>expression</calc> and its result is shown as "
    "<result>value</result>. Finish with the final answer in \\boxed{}."
)
JSON_SYSTEM = (
    'You can call the function calculator(expression). To call it, write <tool_call>{"name": "calculator", '
    '"arguments": {"expression": "..."}}</tool_call>. Finish with the final answer in \\boxed{}.'
)


def json_call(text: str) -> bool:
    match = re.search(r"<tool_call>(.*?)</tool_call>", text, re.S)
    if not match:
        return False
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError:
        return False
    return isinstance(call, dict) and call.get("name") == "calculator" and isinstance(call.get("arguments"), dict)


PROTOCOLS = {
    "TRL JSON tool call, 1 demo": (
        JSON_SYSTEM,
        '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>\n<result>408</result>\n'
        "The answer is \\boxed{408}.",
        json_call,
    ),
    "<calc> tag, description only": (CALC_SYSTEM, None, lambda t: bool(re.search(r"<calc>.+?</calc>", t, re.S))),
    "<calc> tag, 1 demo (default)": (
        CALC_SYSTEM,
        "<calc>12 * 34</calc>\n<result>408</result>\nThe answer is \\boxed{408}.",
        lambda t: bool(re.search(r"<calc>.+?</calc>", t, re.S)),
    ),
    "```python block, 1 demo": (
        "You can run Python: write a ```python code block that prints the result; its output is shown in an "
        "```output block. Finish with the final answer in \\boxed{}.",
        "```python\nprint(12 * 34)\n```\n```output\n408\n```\nThe answer is \\boxed{408}.",
        lambda t: bool(re.search(r"```python\n.+?```", t, re.S)),
    ),
}


def main() -> None:
    cfg = resolved_config(["+experiment=calculator"]).cfg
    _, heldout = load_splits(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, seed=0)
    questions = [row["prompt"][-1] for row in list(heldout)[:PROBLEMS]]
    print(f"Tool-call protocols: {PROBLEMS} problems x {SAMPLES} samples at temperature 1, untrained {cfg.model.name}")
    for name, (system, demo, is_call) in PROTOCOLS.items():
        shown = [{"role": "user", "content": DEMO_QUESTION}, {"role": "assistant", "content": demo}] if demo else []
        prompts = [[{"role": "system", "content": system}, *shown, q] for q in questions for _ in range(SAMPLES)]
        torch.manual_seed(0)
        texts = generate_completions(model, tokenizer, prompts, 40, len(prompts), None, temperature=1.0)
        calls = sum(is_call(t) for t in texts)
        print(f"  {name:32s} {calls:3d}/{len(texts)} completions hold a well-formed call ({calls / len(texts):.0%})")


if __name__ == "__main__":
    main()
