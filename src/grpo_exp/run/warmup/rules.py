"""The warm-up's settings checked before any model loads: what each source needs, what it cannot run with, and the
settings that act only with a source (ONLY_WITH, checked by grpo_exp.run.inert)."""

from pathlib import Path

from omegaconf import DictConfig

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.run.warmup.expert import load_expert
from grpo_exp.schema import WarmupSource

PLAYED = (WarmupSource.policy, WarmupSource.expert)
# A user's conversation is cut at this many tokens (TRL's SFT truncation); played episodes are not cut (each is at most
# the prompt and trainer.max_completion_length)
DATA_MAX_LENGTH = 1024


def warmup_rows_and_tokens(cfg: DictConfig, processes: int, played_tokens: int) -> tuple[int, int]:
    """What a process's warm-up forward takes at once: its rows (warmup.micro_batch_size, else its share of
    warmup.batch_size; 0 without a warm-up) and their length, at most (`played_tokens`: an episode's)."""
    warmup = cfg.warmup
    if warmup.source is WarmupSource.none:
        return 0, 0
    rows = warmup.micro_batch_size or max(warmup.batch_size // processes, 1)
    return rows, played_tokens if warmup.source in PLAYED else DATA_MAX_LENGTH


def check_warmup(cfg: DictConfig, native_tool_calling: bool, processes: int) -> None:
    """One UserError naming the first setting the warm-up cannot run with (`processes`: that train together)."""
    warmup = cfg.warmup
    source = warmup.source
    if source is WarmupSource.none:
        return
    if warmup.batch_size % processes:
        raise UserError(
            f"warmup.batch_size={warmup.batch_size} is split over the {processes} processes that train: give a "
            f"multiple of {processes}"
        )
    share, micro = warmup.batch_size // processes, warmup.micro_batch_size
    if micro is not None and share % micro:
        each = f"the {share} of each of the {processes} processes" if processes > 1 else f"its {share}"
        raise UserError(
            f"warmup.micro_batch_size={micro} does not divide warmup.batch_size={warmup.batch_size} ({each}): give "
            f"a divisor of {share}"
        )
    if cfg.model.lora.enabled:
        raise UserError(
            f"warmup.source={source.value} with model.lora.enabled=true: the warm-up trains every weight, and "
            "GRPO's LoRA adapters would start from the model before it; set model.lora.enabled=false, or warmup=none"
        )
    if source is WarmupSource.dataset:
        if not warmup.data:
            raise UserError(
                "warmup.source=dataset needs warmup.data: a JSONL file or a `datasets` dataset of conversations "
                "(`messages`, or `prompt` and `completion`)"
            )
        local = Path(warmup.data).expanduser()
        if local.suffix in (".jsonl", ".json") and not local.is_file():
            raise UserError(f"warmup.data={warmup.data}: no such file")
    if source is WarmupSource.expert:
        if not warmup.expert:
            raise UserError("warmup.source=expert needs warmup.expert=module:name, the function that plays")
        load_expert(warmup.expert)
    if source in PLAYED and native_tool_calling:
        raise UserError(
            f"warmup.source={source.value} plays episodes through grpo_exp's own multi-turn loop, and this run's "
            "environments run through TRL's tool-calling loop (rollout.tool_calling resolved to native): set "
            "rollout.tool_calling=tags, or give demonstrations (warmup.source=dataset)"
        )


def _source(*sources: WarmupSource):
    return lambda cfg: cfg.warmup.source in sources


def _here(cfg: DictConfig) -> str:
    return f"this run has warmup.source={cfg.warmup.source.value}"


ONLY_WITH = (
    OnlyWith(
        ("warmup",),
        lambda cfg: cfg.warmup.source is not WarmupSource.none,
        "by the warm-up stage (warmup=sft)",
        lambda cfg: "this run has no warm-up (warmup.source=none)",
        "add warmup=sft",
        but=("warmup.source",),
    ),
    OnlyWith(
        ("warmup.data", "warmup.split"),
        _source(WarmupSource.dataset),
        "with warmup.source=dataset",
        _here,
        "set warmup.source=dataset",
    ),
    OnlyWith(
        ("warmup.expert",), _source(WarmupSource.expert), "with warmup.source=expert", _here, "set warmup.source=expert"
    ),
    OnlyWith(
        ("warmup.samples_per_prompt", "warmup.temperature"),
        _source(WarmupSource.policy),
        "with warmup.source=policy (an expert plays each prompt once, its own way)",
        _here,
        "set warmup.source=policy",
    ),
    OnlyWith(
        ("warmup.prompts", "warmup.min_reward"),
        _source(*PLAYED),
        "with a source that plays episodes (warmup.source=policy or expert)",
        _here,
        "set warmup.source=policy or expert",
    ),
)
