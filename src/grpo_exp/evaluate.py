"""Held-out evaluation: greedy accuracy of a model on a dataset split, judged by a verifier."""

from dataclasses import dataclass, field

import torch
from datasets import Dataset
from tqdm.auto import tqdm

from grpo_exp.verification import Verifier


@dataclass
class EvalResult:
    accuracy: float  # correct / scored (problems with an unparseable reference are not scored)
    correct: int
    scored: int
    samples: list[dict] = field(default_factory=list)


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    batch_size: int,
    desc: str | None,
    temperature: float = 0.0,
    stop_strings: list[str] | None = None,
) -> list[str]:
    """Completions for chat prompts, batched with left padding: greedy at temperature 0, else sampled.

    Generation of a sequence ends at EOS or at the first of `stop_strings` (kept in the text)."""
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    completions: list[str] = []
    try:
        for start in tqdm(range(0, len(texts), batch_size), desc=desc, unit="batch", disable=desc is None):
            batch = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(model.device)
            output = model.generate(
                **batch,
                do_sample=temperature > 0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                temperature=temperature or None,
                top_p=None,
                top_k=None,
                stop_strings=stop_strings,
                tokenizer=tokenizer if stop_strings else None,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    finally:
        model.train(was_training)
        tokenizer.padding_side = padding_side
    return completions


def heldout_accuracy(
    model, tokenizer, dataset: Dataset, verifier: Verifier, max_new_tokens: int, batch_size: int, desc: str
) -> EvalResult:
    completions = generate_completions(model, tokenizer, dataset["prompt"], max_new_tokens, batch_size, desc)
    labels = verifier(completions, dataset["solution"])
    scored = [label for label in labels if label is not None]
    samples = [
        {"question": q, "solution": s, "completion": c, "correct": label}
        for q, s, c, label in zip(dataset["question"], dataset["solution"], completions, labels, strict=True)
    ]
    correct = sum(scored)
    return EvalResult(correct / len(scored) if scored else float("nan"), correct, len(scored), samples)
