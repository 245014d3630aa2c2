"""A real TRL GRPOTrainer (grpo_exp's seam subclass) on the tiny model, for tests that call its steps directly."""

from transformers import AutoModelForCausalLM

from grpo_exp.data import load_splits
from grpo_exp.models import build_tiny_model, load_tokenizer
from grpo_exp.trainer.config import grpo_config
from grpo_exp.trainer.seam import HookedGRPOTrainer, ScoredBatch
from tests.conftest import TINY_RUN, compose_config

G = 4


class Recording(HookedGRPOTrainer):
    """The seam's own subclass hooks, recording every ScoredBatch they receive."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[ScoredBatch] = []

    @property
    def wants_scored_batch(self) -> bool:
        return True

    def after_scoring(self, batch: ScoredBatch) -> None:
        self.batches.append(batch)


def logged(trainer: Recording, key: str) -> list[float]:
    return [step[key] for step in trainer.state.log_history if key in step]


def make_trainer(
    tmp_path,
    reward,
    mode: str = "keep",
    prompts: int = 3,
    overrides=(),
    attention: str = "sdpa",
    trainer_class: type[Recording] = Recording,
    **kwargs,
) -> Recording:
    cfg = compose_config(
        [*TINY_RUN, f"trainer.num_generations={G}", f"trainer.prompts_per_step={prompts}", "logger=none", *overrides]
    )
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        build_tiny_model(cfg.model, tokenizer, cfg.trainer.seed).save_pretrained(model_dir)
    train_set, _ = load_splits(cfg.dataset)
    return trainer_class(
        model=AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention),
        reward_funcs=[reward],
        args=grpo_config(cfg.trainer, tmp_path / "trainer", "none", [1.0], False),
        train_dataset=train_set,
        processing_class=tokenizer,
        zero_variance_groups=mode,
        **kwargs,
    )


def generation_batch(trainer: Recording, prompts: int) -> dict:
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; the loss reads it
    inputs = [trainer.train_dataset[i] for i in range(prompts) for _ in range(G)]
    return trainer._generate_and_score_completions(inputs)
