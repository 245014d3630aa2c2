"""TRL's VLLMGeneration, adjusted where TRL's own cannot serve (grpo_exp.trainer.vllm_engine says where and why):
- a colocated engine in the dtype the run asks for (TRL leaves vLLM's "auto", which on CPU samples a float32 policy
  in bfloat16: measured 0.025 a token from the policy's log-probabilities, against 5e-6 in float32);
- on CPU, the weight sync through vLLM's `reload_weights`: a colocated engine reloads from the policy's parameters in
  process; a server from a safetensors file the trainer writes to `weights_dir`, asked over vLLM's /collective_rpc
  (its dev mode, with grpo_exp.trainer.vllm_worker's extension), with no NCCL group.
Generation, the parameters' gathering (PEFT merged, DeepSpeed gathered) and the prefix-cache reset stay TRL's."""

import atexit
import functools
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

import requests
from safetensors.torch import save_file

from grpo_exp.errors import UserError
from grpo_exp.rollout.seeded_sampling import SeededClient
from grpo_exp.rollout.vllm_turns import served_failure, server_url
from grpo_exp.trainer.vllm_worker import reload_policy

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"


def adjusted_generation(
    trl_class: type,
    *,
    dtype: str,
    eager: bool,
    reload: bool,
    weights_dir: Path,
    setting: str,
    sampling_seed: int | None = None,
) -> type:
    """A subclass of TRL's VLLMGeneration (`trl_class`): a colocated engine in `dtype` (`eager`: without
    torch.compile); `reload`: the weight sync through vLLM's reload (TRL's otherwise); `setting`: the run's choice
    its messages name (generation=vllm_async); `sampling_seed`: a server's prompts each sampled from a seed of its
    own drawn from it (grpo_exp.rollout.seeded_sampling; None: vLLM's one generator)."""

    class AdjustedVLLMGeneration(trl_class):
        seed_of_samples = sampling_seed  # grpo_exp.rollout.vllm_turns seeds its own clients with it too

        def _init_vllm(self):
            self._init_engine_or_client()
            if self.mode == "server" and sampling_seed is not None and hasattr(self, "vllm_client"):
                self.vllm_client = SeededClient(self.vllm_client, sampling_seed)

        def _init_engine_or_client(self):
            if self.mode == "colocate":
                with engine_settings(dtype, eager):
                    super()._init_vllm()
                if self.accelerator.num_processes > 1:
                    # vLLM shuts its engine down at exit, tearing down its groups in the process group: after
                    # grpo_exp destroys that (run.distributed, at exit) it fails with a traceback. Registered later,
                    # this runs first (atexit is last in, first out).
                    atexit.register(self.llm.llm_engine.engine_core.shutdown)
                return None
            if not reload:
                return super()._init_vllm()
            # TRL's server init, less its NCCL group (init_communicator): the server reloads from weights_dir.
            from trl.generation.vllm_client import VLLMClient

            if self.accelerator.is_main_process:
                base_url = server_url(self)
                check_dev_mode(base_url, setting)
                self.vllm_client = VLLMClient(base_url=base_url, connection_timeout=self.server_timeout)
            self.accelerator.wait_for_everyone()

        def generate(self, *args, **kwargs):
            try:
                return super().generate(*args, **kwargs)
            except Exception as err:  # the server died or refused (TRL's client raises a bare Exception)
                if self.mode != "server" or not self.accelerator.is_main_process:  # only the main one asks it
                    raise
                raise served_failure(server_url(self), "to generate a batch", err) from err

        def sync_weights(self):
            if not reload:
                return super().sync_weights()
            started = time.perf_counter()
            if self.mode == "colocate":
                self.llm.collective_rpc(reload_policy, kwargs={"weights_iterator": self._iter_named_params()})
                self.llm.reset_prefix_cache()
            else:
                reload_served(self, weights_dir, setting)
            log.debug("vLLM weights reloaded in %.2f s", time.perf_counter() - started)

    return AdjustedVLLMGeneration


@contextmanager
def engine_settings(dtype: str, eager: bool):
    """TRL builds its colocated engine with `LLM(...)` by the module's name for it: here, with `dtype`, and
    `eager` (enforce_eager: on CPU, torch.compile's warm-up took 80 s of a 2-step run's 132 on 2 cores, each process
    compiling its own engine; grpo-exp serve and the evaluation's engine start eager there too)."""
    import trl.generation.vllm_generation as trl_generation

    trl_llm = trl_generation.LLM
    trl_generation.LLM = functools.partial(trl_llm, dtype=dtype, enforce_eager=eager)
    try:
        yield
    finally:
        trl_generation.LLM = trl_llm


def reload_served(generation, weights_dir: Path, setting: str) -> None:
    """Write the policy's parameters to weights_dir (main process; every process takes part in the gathering) and
    ask the server to reload from there. The file is replaced atomically: a server never reads half a file."""
    if not generation.accelerator.is_main_process:
        for _ in generation._iter_named_params():  # take part in the gathering collectives
            pass
    else:
        tensors = {name: param.detach().cpu().contiguous() for name, param in generation._iter_named_params()}
        weights_dir.mkdir(parents=True, exist_ok=True)
        partial = weights_dir / f".{WEIGHTS_FILE}.{os.getpid()}"
        save_file(tensors, str(partial))
        os.replace(partial, weights_dir / WEIGHTS_FILE)
        reload = {"method": "reload_policy", "kwargs": {"weights_path": str(weights_dir.resolve())}}
        post(generation.vllm_client.base_url, "/collective_rpc", reload, setting)
        generation.vllm_client.reset_prefix_cache()
    generation.accelerator.wait_for_everyone()


def post(base_url: str, path: str, payload: dict, setting: str) -> None:
    try:
        response = requests.post(f"{base_url}{path}", json=payload, timeout=600)
    except requests.RequestException as err:
        raise UserError(f"{setting}: the vLLM server at {base_url} did not answer {path} ({err})") from err
    if response.status_code != 200:
        hint = ""
        if "reload_policy" in response.text:
            hint = "; start it with --worker-extension-cls grpo_exp.trainer.vllm_worker.PolicyReload (grpo-exp serve)"
        raise UserError(
            f"{setting}: the vLLM server at {base_url} refused {path} ({response.status_code}: "
            f"{response.text[:300]}){hint}"
        )


def check_dev_mode(base_url: str, setting: str) -> None:
    """The reload endpoint is in vLLM's dev mode only: say how to start the server when it is off."""
    try:
        response = requests.get(f"{base_url}/server_info", timeout=30)
    except requests.RequestException as err:
        raise UserError(
            f"{setting}: no vLLM server answers at {base_url} ({type(err).__name__}); start one with "
            "grpo-exp serve (docs/vllm.md)"
        ) from err
    if response.status_code == 404:
        raise UserError(
            f"{setting}: the vLLM server at {base_url} runs without its dev endpoints, through which "
            "the trainer reloads its weights on CPU: start it with VLLM_SERVER_DEV_MODE=1 (grpo-exp serve does)"
        )
