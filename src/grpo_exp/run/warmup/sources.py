"""Where the warm-up's demonstrations come from (warmup.source):
- dataset: the user's conversations, in TRL's formats, trained as TRL trains them;
- policy: the policy's own episodes on the training prompts, sampled at warmup.temperature (rejection sampling:
  STaR, RFT), kept where the run's reward pays at least warmup.min_reward;
- expert: the user's expert's episodes on the same prompts, kept by the same rule.
Played episodes are tokenised as GRPO's completions are (a multi-turn run's through its own rollout loop), and only
the player's tokens are trained: the prompt and the tools' observations are masked out of the loss."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset

from grpo_exp.data_parallel import map_over_processes
from grpo_exp.errors import UserError
from grpo_exp.generation import left_padded_eval, prompt_ids
from grpo_exp.plugins import user_error
from grpo_exp.probe.battery import score_texts, weighted_total
from grpo_exp.rollout.multiturn import greedy_generation
from grpo_exp.run.build import RunParts
from grpo_exp.run.distributed import is_main_process
from grpo_exp.run.resolve import RunSpec
from grpo_exp.run.warmup.expert import ExpertTurns, expert_turn, load_expert
from grpo_exp.schema import WarmupSource

CONVERSATION_FORMATS = "`messages` (a conversation), or `prompt` and `completion`"


@dataclass
class Demonstrations:
    """What the warm-up trains on, and how it was gathered: `played` episodes (None: the user's data)."""

    dataset: Dataset
    played: int | None
    mean_reward: float | None = None  # the reward of the episodes played, before keeping

    @property
    def kept(self) -> int:
        return len(self.dataset)

    def record(self) -> dict:
        return {"demonstrations": self.kept, "played": self.played, "played_mean_reward": self.mean_reward}


@dataclass
class Episode:
    """One played episode: its tokens, which of them the player wrote (1) or a tool answered (0), and its reward."""

    prompt_ids: list[int]
    completion_ids: list[int]
    player_mask: list[int]
    text: str
    reward: float | None

    def example(self) -> dict:
        """SFTTrainer's pre-tokenised example: the prompt and the observations out of the loss."""
        mask = [0] * len(self.prompt_ids) + self.player_mask
        return {"input_ids": self.prompt_ids + self.completion_ids, "completion_mask": mask}


def demonstrations(spec: RunSpec, parts: RunParts, model, tokenizer, train_set, out_dir: Path) -> Demonstrations:
    """The warm-up's demonstrations from warmup.source; played ones also written to out_dir/demonstrations.jsonl."""
    warmup = spec.cfg.warmup
    if warmup.source is WarmupSource.dataset:
        return user_conversations(warmup.data, warmup.split)
    episodes = played_episodes(spec, parts, model, tokenizer, train_set)
    kept = [e for e in episodes if e.reward is not None and e.reward >= warmup.min_reward]
    if is_main_process():
        with (out_dir / "demonstrations.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps({"completion": e.text, "reward": e.reward}) + "\n" for e in kept)
    rewards = [e.reward for e in episodes if e.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    if not kept:
        best = max(rewards, default=None)
        raise UserError(
            f"warmup.source={warmup.source.value}: none of the {len(episodes)} episodes played was paid "
            f"warmup.min_reward={warmup.min_reward:g} or more (the best: {best}, the mean: {mean}); lower "
            "warmup.min_reward, play more (warmup.samples_per_prompt, warmup.prompts), or give demonstrations "
            "(warmup.source=dataset warmup.data=...)"
        )
    return Demonstrations(Dataset.from_list([e.example() for e in kept]), len(episodes), mean)


def user_conversations(path: str, split: str) -> Demonstrations:
    """warmup.data: a JSONL file, or a `datasets` dataset (a hub id or a directory), of conversations."""
    from datasets import load_dataset

    local = Path(path).expanduser()
    try:
        if local.suffix in (".jsonl", ".json"):
            dataset = load_dataset("json", data_files=str(local), split="train")
        else:
            dataset = load_dataset(path, split=split)
    except Exception as err:  # noqa: BLE001 - the datasets library's errors are many; each ends here in one line
        where = f"warmup.data={path}" + ("" if local.suffix in (".jsonl", ".json") else f" (warmup.split={split})")
        raise user_error(f"{where}: could not be read; reading it", err) from None
    columns = set(dataset.column_names)
    if "messages" not in columns and not {"prompt", "completion"} <= columns:
        raise UserError(
            f"warmup.data={path}: its columns are {sorted(columns)}; the warm-up reads {CONVERSATION_FORMATS} "
            "(TRL's conversational formats)"
        )
    if len(dataset) == 0:
        raise UserError(f"warmup.data={path}: holds no conversation")
    return Demonstrations(dataset, None)


def played_episodes(spec: RunSpec, parts: RunParts, model, tokenizer, train_set) -> list[Episode]:
    """The training prompts (the first warmup.prompts) played by the policy (warmup.samples_per_prompt times each) or
    by the expert (once), each scored by the run's reward; every process plays its share, all get every episode."""
    warmup, batch_size = spec.cfg.warmup, spec.cfg.eval.batch_size
    rows = train_set.to_list()[: warmup.prompts or None]
    expert = load_expert(warmup.expert) if warmup.source is WarmupSource.expert else None
    repeats = 1 if expert is not None else warmup.samples_per_prompt

    def work(share: list[dict], main: bool) -> list[Episode]:
        desc = f"warm-up: playing {len(rows) * repeats} episodes" if main else None
        if parts.rollout is None:
            played = _single_turn(spec, model, tokenizer, share, expert, batch_size)
        else:
            played = _multi_turn(spec, parts, model, tokenizer, share, expert, batch_size, desc)
        return _scored(spec, parts, tokenizer, share, played)

    items = [row for row in rows for _ in range(repeats)]
    return map_over_processes(items, batch_size, work)


def _single_turn(spec, model, tokenizer, rows, expert, batch_size) -> list[tuple]:
    """(prompt ids, completion ids, player mask, no trajectory fields) of each row: the policy's sampled completion,
    or the expert's."""
    prompts = [prompt_ids(tokenizer, row["prompt"]) for row in rows]
    if expert is not None:
        path = spec.cfg.warmup.expert
        texts = [expert_turn(expert, path, "", row) for row in rows]
        completions = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    else:
        completions = []
        for start in range(0, len(prompts), batch_size):
            completions += _sampled(spec, model, tokenizer, prompts[start : start + batch_size])
    return [(p, c, [1] * len(c), {}) for p, c in zip(prompts, completions, strict=True)]


@torch.no_grad()
def _sampled(spec: RunSpec, model, tokenizer, prompts: list[list[int]]) -> list[list[int]]:
    """One sampled completion per prompt, as GRPO samples them (warmup.temperature), up to and with its EOS."""
    with left_padded_eval(model, tokenizer):
        batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(model.device)
        output = model.generate(
            **batch,
            do_sample=True,
            temperature=spec.cfg.warmup.temperature,
            top_p=None,
            top_k=None,
            max_new_tokens=spec.cfg.trainer.max_completion_length,
            pad_token_id=tokenizer.pad_token_id,
        )
    eos = tokenizer.eos_token_id
    completions = []
    for row in output[:, batch["input_ids"].shape[1] :].tolist():
        completions.append(row[: row.index(eos) + 1] if eos in row else row)
    return completions


def _multi_turn(spec, parts, model, tokenizer, rows, expert, batch_size, desc) -> list[tuple]:
    """Each row's episode through the run's rollout loop: the policy sampling its turns, or the expert playing."""
    generation = greedy_generation(tokenizer) | {"do_sample": True, "temperature": spec.cfg.warmup.temperature}
    engine = None if expert is None else ExpertTurns(expert, spec.cfg.warmup.expert, tokenizer, rows)
    prompts = [row["prompt"] for row in rows]
    trajectories = parts.rollout.run(model, tokenizer, prompts, generation, batch_size, desc, rows=rows, engine=engine)
    return [(t.prompt_ids, t.completion_ids, t.env_mask, t.fields()) for t in trajectories]


def _scored(spec: RunSpec, parts: RunParts, tokenizer, rows: list[dict], played: list[tuple]) -> list[Episode]:
    """Each episode with the run's reward, the weighted mix of its components as TRL sums them."""
    if not rows:
        return []
    texts = [tokenizer.decode(p[1], skip_special_tokens=True) for p in played]
    columns = [row | p[3] for row, p in zip(rows, played, strict=True)]  # a trajectory's fields too
    scores = []
    for func in parts.reward_funcs:
        try:
            scores.append(score_texts(func, columns, texts, tokenizer))
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - a component that cannot score outside training: said, not a traceback
            raise user_error(f"warmup.source={spec.cfg.warmup.source.value}: the reward {func.__name__}", err) from None
    totals = [weighted_total(values, spec.reward_weights) for values in zip(*scores, strict=True)]
    return [Episode(p[0], p[1], p[2], text, total) for p, text, total in zip(played, texts, totals, strict=True)]
