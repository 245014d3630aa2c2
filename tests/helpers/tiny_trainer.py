"""A real TRL GRPOTrainer (grpo_exp's seam subclass) on the tiny model, for tests that call its steps directly."""

from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from grpo_exp.data import load_splits
from grpo_exp.models import load_tokenizer
from grpo_exp.trainer.config import GRPOExpConfig, grpo_exp_config
from grpo_exp.trainer.scored_batch import ScoredBatch
from grpo_exp.trainer.seam import HookedGRPOTrainer
from support.config import TINY_RUN, compose_config
from support.models import write_tiny_model

G = 4
# grpo_exp's features are on by default (grpo_exp.schema.TrainerSchema); a test's trainer is TRL's as it is unless
# the test turns one on.
PLAIN_TRL = {
    "zero_variance_groups": "keep",
    "shared_prompt_forward": False,
    "fast_generation": False,
    "mismatch_metrics": False,
}
# grpo_exp's own trainer knobs: GRPOExpConfig's fields beyond GRPOConfig's.
KNOBS = set(GRPOExpConfig.__dataclass_fields__) - set(GRPOConfig.__dataclass_fields__)


def distinct(completions, **kwargs) -> list[float]:
    """A reward of 0 .. G-1 by position in the group: every group has a spread, whatever the model says."""
    return [float(i % G) for i in range(len(completions))]


def knob_overrides(knobs: dict) -> list[str]:
    """`trainer.<knob>=<value>` overrides, as on the command line."""
    return [f"trainer.{k}={'null' if v is None else str(v).lower()}" for k, v in knobs.items()]


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
    """The tiny trainer; `mode` and any other of grpo_exp's trainer knobs in `kwargs` set in its config (PLAIN_TRL
    otherwise), the rest of `kwargs` passed to the trainer."""
    knobs = PLAIN_TRL | {"zero_variance_groups": mode} | {k: kwargs.pop(k) for k in KNOBS & set(kwargs)}
    sizes = [f"trainer.num_generations={G}", f"trainer.prompts_per_step={prompts}"]
    cfg = compose_config([*TINY_RUN, *sizes, "logger=none", *knob_overrides(knobs), *overrides])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        write_tiny_model(model_dir, cfg.trainer.seed)
    train_set, _ = load_splits(cfg.dataset)
    return trainer_class(
        model=AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention),
        reward_funcs=[reward],
        args=grpo_exp_config(cfg.trainer, tmp_path / "trainer", "none", [1.0], False),
        train_dataset=train_set,
        processing_class=tokenizer,
        **kwargs,
    )


def generation_batch(trainer: Recording, prompts: int) -> dict:
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; the loss reads it
    inputs = [trainer.train_dataset[i] for i in range(prompts) for _ in range(G)]
    return trainer.generate_and_score(inputs)
