"""Models of a real architecture's shape with random weights (model=shape model.shape=qwen2.5-1.5b): memory and speed
at the seed's size without its weights (no model hub here).

A shape is a published config.json's numbers, kept in grpo_exp/architectures/<name>.json. Its tokenizer is the
embedded model's (its chat template and special tokens), padded to the shape's vocabulary with tokens that decode to
text, so that every id the random model samples decodes, and rewards and logging run as in a real run. The padding
tokens are whole entries of the BPE vocabulary without merges: encoding text never produces them, as a real
tokenizer's rare tokens are seldom produced. Such a model learns nothing: its completions run to the length limit.
"""

import json
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

from grpo_exp.errors import UserError

ARCHITECTURES_DIR = Path(__file__).parent / "architectures"
# Keys of a shape's file that are not transformers' (the model it is the shape of, where its numbers were published)
PUBLISHED_KEY, SOURCE_KEY = "_published", "_source"


def shape_names() -> list[str]:
    return sorted(p.stem for p in ARCHITECTURES_DIR.glob("*.json"))


def shape_numbers(name: str | None, key: str = "model.shape") -> dict:
    """The published config of shape `name` (UserError naming `key` and the shapes there are)."""
    path = ARCHITECTURES_DIR / f"{name}.json"
    if not name or not path.is_file():
        raise UserError(f"{key}={name}: no such shape; the shapes: {', '.join(shape_names())} ({ARCHITECTURES_DIR})")
    return json.loads(path.read_text(encoding="utf-8"))


def published_model(name: str) -> str:
    """The hub id of the model whose shape `name` is."""
    return shape_numbers(name)[PUBLISHED_KEY]


def shape_config(name: str, overrides: dict | None = None, key: str = "model.shape") -> PretrainedConfig:
    """transformers' config of shape `name`, with `overrides` (model.architecture: fewer layers for a quick run)."""
    numbers = {k: v for k, v in shape_numbers(name, key).items() if not k.startswith("_")} | dict(overrides or {})
    model_type = numbers.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **numbers)
    except (TypeError, ValueError) as err:
        raise UserError(f"model.architecture: {err} (for {key}={name})") from err


def parameter_count(config: PretrainedConfig) -> int:
    """Parameters of a model of `config`, counted on the meta device (nothing allocated)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    with torch.device("meta"):  # the class itself: nothing loads, not even through AutoModel's factory
        skeleton = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config)
    return sum(p.numel() for p in skeleton.parameters())


def pad_vocabulary(tokenizer_json: dict, size: int) -> dict:
    """A BPE tokenizer.json whose vocabulary is extended to `size` entries: each new id a concatenation of two of the
    base vocabulary's ordinary (not special) tokens, so that it decodes to text; deterministic, each one distinct."""
    model = tokenizer_json["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    special = {t["content"] for t in tokenizer_json.get("added_tokens", [])}
    ordinary = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1]) if token not in special]
    taken = set(vocab)
    next_id, step = max(vocab.values()) + 1, 0
    while next_id < size:
        first = ordinary[step % len(ordinary)]
        second = ordinary[(step // len(ordinary) * 7919 + step * 31) % len(ordinary)]
        step += 1
        if first + second in taken:
            continue
        taken.add(first + second)
        vocab[first + second] = next_id
        next_id += 1
    return tokenizer_json | {"model": model | {"vocab": vocab}}


def save_padded_tokenizer(base_dir: Path, size: int, target: Path) -> None:
    """The tokenizer saved in `base_dir` (a fast BPE tokenizer), padded to `size` ids, saved into `target`."""
    from transformers import AutoTokenizer

    target.mkdir(parents=True, exist_ok=True)
    for file in base_dir.iterdir():
        if file.is_file() and file.name != "tokenizer.json":
            (target / file.name).write_bytes(file.read_bytes())
    tokenizer_json = json.loads((base_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if tokenizer_json["model"]["type"] != "BPE":
        raise ValueError(f"cannot pad a {tokenizer_json['model']['type']} tokenizer (BPE only)")
    padded = pad_vocabulary(tokenizer_json, size)
    (target / "tokenizer.json").write_text(json.dumps(padded, ensure_ascii=False), encoding="utf-8")
    loaded = AutoTokenizer.from_pretrained(target)
    if len(loaded) != size:
        raise ValueError(f"the padded tokenizer has {len(loaded)} ids, not {size}")
