"""P(Yes) head cost: `python -m benchmarks.p_yes` (part of `make bench`).

On the embedded SmolLM2 and one default-sized step (2 prompts x 4 completions of up to 96 tokens), times the
generation of the completions and the P(Yes) scoring of the same 8 answers (one batched forward pass), in
alternation, and prints their ratio.
"""

import statistics
import time

import torch

from grpo_exp.data import load_splits
from grpo_exp.generation import generate_completions
from grpo_exp.models import load_model, load_tokenizer
from grpo_exp.schema import ScorerSchema
from grpo_exp.verification.p_yes import p_yes_from_logits, question_messages, yes_no_token_ids
from support.config import resolved_config

ROUNDS = 3


def main() -> None:
    cfg = resolved_config([]).cfg
    torch.manual_seed(0)
    train, _ = load_splits(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model = load_model(cfg.model, tokenizer, cfg.cache_dir, seed=0)
    group = cfg.trainer.num_generations
    prompts = [p for p in train["prompt"][: cfg.trainer.prompts_per_step] for _ in range(group)]
    questions = [q for q in train["question"][: cfg.trainer.prompts_per_step] for _ in range(group)]
    question = ScorerSchema()
    yes_no = yes_no_token_ids(tokenizer, question.yes_token, question.no_token)
    generation, scoring = [], []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        answers = generate_completions(
            model, tokenizer, prompts, cfg.trainer.max_completion_length, len(prompts), None, temperature=1.0
        )
        generation.append(time.perf_counter() - started)
        started = time.perf_counter()
        conversations = [question_messages(question.template, q, a) for q, a in zip(questions, answers, strict=True)]
        p_yes_from_logits(model, tokenizer, conversations, *yes_no, batch_size=len(conversations))
        scoring.append(time.perf_counter() - started)
    gen, score = statistics.mean(generation), statistics.mean(scoring)
    print(
        f"P(Yes) head: {score:.2f} s to score {len(prompts)} answers vs {gen:.2f} s to generate them "
        f"-> {score / gen:.1%} of the generation time ({ROUNDS} alternating rounds, embedded SmolLM2)"
    )


if __name__ == "__main__":
    main()
