"""The contract with TRL: everything grpo_exp's one seam (grpo_exp.trainer.seam, with trl_surface) relies on.

When a TRL upgrade changes any of it (a method the seam overrides or calls, a private attribute, the layout of its
last-batch logs, how it aggregates rewards into advantages), these tests fail and say what changed, instead of the
group statistics going quietly wrong. TRL's GRPOTrainer really generates and scores here (tiny model), nothing is
mocked. And no module but the seam reads TRL's private state.
"""

import ast
import importlib
import importlib.metadata
import inspect
import math
import re
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from grpo_exp.data import load_splits
from grpo_exp.models import load_tokenizer
from grpo_exp.trainer import seam, trl_surface
from grpo_exp.trainer.config import grpo_exp_config
from grpo_exp.trainer.scored_batch import ScoredBatch, aggregated_reward
from grpo_exp.trainer.seam import HookedGRPOTrainer
from grpo_exp.trainer.trl_contract import (
    TRL_ATTRIBUTES,
    TRL_LM_HEAD_COMPACT,
    TRL_LM_HEAD_TILE,
    TRL_METHODS,
    TRL_PUBLIC,
    TRL_VLLM_ATTRIBUTES,
    TRL_VLLM_GENERATION,
    VLLM_GENERATION_ATTRIBUTES,
    VLLM_GENERATION_METHODS,
)
from support.config import TINY_RUN, compose_config
from tests.helpers.tiny_trainer import PLAIN_TRL, Recording, knob_overrides

ROOT = Path(__file__).parents[1]


def test_trl_is_pinned_to_one_minor_version_and_installed_at_it():
    (requirement,) = [r for r in importlib.metadata.requires("grpo-exp") if r.split(";")[0].startswith("trl")]
    specifier = SpecifierSet(requirement.removeprefix("trl").split(";")[0].strip())
    installed = importlib.metadata.version("trl")
    assert installed in specifier, f"TRL {installed} is not the version the seam was checked against ({specifier})"
    # One minor version: the next minor release is outside the pin.
    major, minor = (int(x) for x in installed.split(".")[:2])
    assert f"{major}.{minor + 1}.0" not in specifier, f"trl should be pinned to {major}.{minor}.*, not {specifier}"


@pytest.mark.parametrize("name", sorted(TRL_METHODS))
def test_grpo_trainer_still_has_each_method_the_seam_overrides_or_calls_as_the_seam_calls_it(name):
    assert callable(getattr(GRPOTrainer, name, None)), f"GRPOTrainer.{name} is gone: update grpo_exp.trainer.seam"
    signature = inspect.signature(getattr(GRPOTrainer, name))
    theirs = [parameter for parameter in signature.parameters if parameter != "self"]
    passed = list(TRL_METHODS[name])
    assert theirs[: len(passed)] == passed, (
        f"GRPOTrainer.{name}{signature} no longer starts with the parameters the seam passes, {passed}: "
        "update grpo_exp.trainer.seam (and TRL_METHODS)"
    )
    override = HookedGRPOTrainer.__dict__.get(name)
    if override is not None:  # TRL calls the seam's override as it calls its own method
        ours = inspect.signature(override).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values())
        missing = [] if takes_any else [parameter for parameter in theirs if parameter not in ours]
        assert not missing, f"GRPOTrainer.{name} now takes {missing}, which the seam's override does not"


@pytest.fixture(scope="module")
def trl_trainer(tiny_model_dir, tmp_path_factory) -> GRPOTrainer:
    """TRL's own GRPOTrainer (not the seam's subclass) on the tiny model, configured as grpo_exp configures it."""
    cfg = compose_config([*TINY_RUN, "logger=none"])
    output_dir = tmp_path_factory.mktemp("trl") / "trainer"
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=[length_reward],
        args=grpo_exp_config(cfg.trainer, output_dir, "none", [1.0], False),
        train_dataset=load_splits(cfg.dataset)[0],
        processing_class=load_tokenizer(cfg.model, cfg.cache_dir),
    )


@pytest.mark.parametrize("name", TRL_ATTRIBUTES)
def test_grpo_trainer_still_has_each_attribute_the_seam_reads(trl_trainer, name):
    owner = trl_trainer
    for part in name.split("."):
        assert hasattr(owner, part), f"GRPOTrainer.{name} is gone: update grpo_exp.trainer.seam"
        owner = getattr(owner, part)


def trl_private_names(trainer: GRPOTrainer) -> set[str]:
    """The `_`-prefixed names of TRL's GRPOTrainer (transformers' Trainer's among them): its methods and class
    attributes, and what its __init__ sets on an instance."""
    return {name for name in {*dir(GRPOTrainer), *vars(trainer)} if name.startswith("_") and not name.startswith("__")}


def name_of(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def trainer_classes(trees: list[ast.Module]) -> set[str]:
    """The names of the classes that subclass TRL's trainer, through any chain of our own subclasses."""
    classes = [node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    trainers = {"Trainer", "GRPOTrainer"}
    while grown := {c.name for c in classes if c.name not in trainers and {name_of(b) for b in c.bases} & trainers}:
        trainers |= grown
    return trainers


def definitions(scope: ast.Module | ast.ClassDef) -> set[str]:
    """The names a module or class defines: its functions, classes and assignments, and a class's `self.<name> =`."""
    names = set()
    for node in scope.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            names |= {name_of(t) for t in getattr(node, "targets", [getattr(node, "target", None)])}
    if isinstance(scope, ast.ClassDef):
        stored = [n for n in ast.walk(scope) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)]
        names |= {n.attr for n in stored if name_of(n.value) == "self"}
    return names


def private_uses(tree: ast.Module, private: set[str]) -> list[tuple[int, str]]:
    """Where the module names one of `private` as an attribute: `x._name`, or a string given to getattr / setattr /
    hasattr / delattr (monkeypatch.setattr included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Call) and name_of(node.func) in ("getattr", "setattr", "hasattr", "delattr"):
            named = [a.value for a in node.args if isinstance(a, ast.Constant) and a.value in private]
            found += [(node.lineno, f"{name_of(node.func)}(..., {name!r})") for name in named]
    return found


def test_no_module_but_the_seam_reads_trls_private_state(trl_trainer):
    """Every file of src/, tests/ and support/ but the seam: no `x._name` (or getattr(x, "_name")) where `_name` is
    one of TRL's trainer's private names, and no trainer subclass defining one (an override of TRL's internals).
    A private name of our own that TRL happens to share, defined outside any trainer class (a rollout's `_generate`),
    is ours, not TRL's: not flagged."""
    private = trl_private_names(trl_trainer)
    assert {"_logs", "_metrics", "_generate_and_score_completions"} <= private  # the names this test looks for
    the_seam = {Path(seam.__file__), Path(trl_surface.__file__)}  # its overrides, and TRL's surface for run/
    files = [path for folder in ("src", "tests", "support") for path in sorted((ROOT / folder).rglob("*.py"))]
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in files}
    trainers = trainer_classes(list(trees.values()))
    others = {path: tree for path, tree in trees.items() if path not in the_seam}
    ours = set().union(*(definitions(tree) for tree in others.values()))
    classes = [
        (path, node) for path, tree in others.items() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
    ]
    ours |= set().union(*(definitions(node) for _, node in classes if node.name not in trainers))
    found = [
        f"{path.relative_to(ROOT)}:{line} {use}"
        for path, tree in others.items()
        for line, use in private_uses(tree, private - ours)
    ]
    found += [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} defines {sorted(definitions(node) & private)}"
        for path, node in classes
        if node.name in trainers and definitions(node) & private
    ]
    assert not found, f"TRL's private state used outside grpo_exp.trainer.seam (give the seam a public method): {found}"


def test_grpo_trainer_still_takes_a_rollout_func_and_its_config_defaults():
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters
    fields = {f.name: f for f in GRPOConfig.__dataclass_fields__.values()}
    assert fields["multi_objective_aggregation"].default == "sum_then_normalize"
    assert fields["scale_rewards"].default == "group"


def length_reward(completions, **kwargs):
    return [len(c[-1]["content"]) / 100 for c in completions]


def first_of_each_group_skipped(completions, **kwargs):
    """A component that cannot score one member of every group (as a judge whose request failed)."""
    return [None if i % 4 == 0 else float(len(c[-1]["content"]) % 3) for i, c in enumerate(completions)]


def one_step(tmp_path, model_dir, aggregation: str, scale_rewards: str = "group") -> tuple[Recording, ScoredBatch]:
    cfg = compose_config(
        [
            *TINY_RUN,
            "trainer.num_generations=4",
            "trainer.max_steps=1",
            "logger=none",
            f"trainer.scale_rewards={scale_rewards}",
            f"+trainer.extra.multi_objective_aggregation={aggregation}",
            *knob_overrides(PLAIN_TRL),
        ]
    )
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    train_set, _ = load_splits(cfg.dataset)
    trainer = Recording(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[length_reward, first_of_each_group_skipped],
        args=grpo_exp_config(cfg.trainer, tmp_path / "trainer", "none", [1.0, 0.5], False),
        train_dataset=train_set,
        processing_class=tokenizer,
    )
    trainer.train()
    (batch,) = trainer.batches
    return trainer, batch


@pytest.mark.parametrize(
    ("aggregation", "scale_rewards"),
    [("sum_then_normalize", "group"), ("sum_then_normalize", "none"), ("normalize_then_sum", "group")],
)
def test_the_scored_batch_is_what_trl_scored_and_its_reward_is_trls_aggregate(
    tmp_path, tiny_model_dir, aggregation, scale_rewards
):
    trainer, batch = one_step(tmp_path, tiny_model_dir, aggregation, scale_rewards)
    n = 2 * 4
    assert batch.group_size == 4 and batch.reward_names == ["length_reward", "first_of_each_group_skipped"]
    assert len(batch.prompts) == len(batch.texts) == len(batch.rows) == n and batch.trajectories is None
    # The per-component rewards are the functions' own outputs for these completions (None -> NaN).
    messages = [[{"role": "assistant", "content": t}] for t in batch.texts]
    assert batch.rewards[:, 0].tolist() == pytest.approx(length_reward(messages))
    skipped = first_of_each_group_skipped(messages)
    if aggregation == "sum_then_normalize":  # the seam gave each skipped member its group's mean for the component
        assert batch.imputed[:, 1].tolist() == [v is None for v in skipped] and not batch.rewards.isnan().any()
    else:  # TRL already gives a skipped member a z-score of 0 for the component
        assert [math.isnan(v) for v in batch.rewards[:, 1].tolist()] == [v is None for v in skipped]
        assert not batch.imputed.any()
    assert all(r["solution"] is not None and r["question"] for r in batch.rows)
    assert batch.lengths.shape == (n,) and (batch.lengths >= 1).all()

    # TRL's logged mean reward is the weighted nansum of the components, whatever the aggregation.
    logged = trainer.state.log_history[0]
    weighted = aggregated_reward(batch.rewards, torch.tensor([1.0, 0.5]), "sum_then_normalize", 4)
    assert logged["reward"] == pytest.approx(torch.nanmean(weighted).item(), abs=1e-5)

    # The advantages TRL trained with follow from the seam's aggregated reward by TRL's documented formula.
    total = batch.grouped(batch.total)
    if aggregation == "sum_then_normalize":
        expected = total - total.mean(dim=1, keepdim=True)
        if scale_rewards == "group":
            expected = expected / (total.std(dim=1, keepdim=True) + 1e-4)
    else:  # normalised per component inside the group, then summed, then normalised over the batch
        expected = (total - total.mean()) / (total.std() + 1e-4)
    assert batch.grouped(batch.advantages).flatten().tolist() == pytest.approx(expected.flatten().tolist(), abs=1e-4)


# ---- every name of TRL's the seam and TRL's surface read, derived from their source ---------------------------------


def trl_reads(path: Path) -> tuple[set[str], set[str]]:
    """(the trainer's attributes a module reads, `self.<name>`; its args' fields, `self.args.<name>` or
    `args.<name>`)."""
    own, args = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and name_of(node.value) == "self" and isinstance(node.value, ast.Name):
            own.add(node.attr)
        elif isinstance(node, ast.Attribute) and name_of(node.value) == "args":
            args.add(node.attr)
    return own, args


def test_every_trl_name_the_seam_and_the_surface_read_exists_and_is_declared(trl_trainer):
    """Derived from seam.py and trl_surface.py, so that a new use cannot go unchecked: each attribute of the trainer
    they read that grpo_exp does not define (its mixins' methods and what they store) exists on TRL's own trainer and
    is declared in trl_contract; each field of its args that is not one of grpo_exp's own knobs is GRPOConfig's."""
    from dataclasses import fields

    from grpo_exp.trainer import hooks
    from grpo_exp.trainer.config import GRPOExpConfig

    files = [Path(seam.__file__), Path(trl_surface.__file__)]
    reads = [trl_reads(path) for path in files]
    classes = [
        node
        for path in [*files, Path(hooks.__file__)]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
    ]
    ours = set().union(*(definitions(node) for node in classes))
    theirs = set().union(*(own for own, _ in reads)) - ours - {"args"}
    assert {"vllm_importance_sampling_correction", "_logs", "accelerator"} <= theirs  # what this test looks for
    missing = sorted(name for name in theirs if not hasattr(trl_trainer, name) and name not in TRL_VLLM_ATTRIBUTES)
    assert not missing, f"TRL's GRPOTrainer no longer has {missing}: update grpo_exp.trainer.seam / trl_surface"
    declared = {name.split(".")[0] for name in TRL_ATTRIBUTES} | set(TRL_METHODS) | set(TRL_PUBLIC)
    declared |= set(TRL_VLLM_ATTRIBUTES)
    undeclared = sorted(theirs - declared)
    assert not undeclared, f"the seam reads {undeclared} of TRL's trainer: declare them in trainer.trl_contract"

    own_knobs = {f.name for f in fields(GRPOExpConfig)} - {f.name for f in fields(GRPOConfig)}
    fields_read = set().union(*(args for _, args in reads)) - own_knobs
    gone = sorted(name for name in fields_read if not hasattr(trl_trainer.args, name))
    assert not gone, f"GRPOConfig no longer has {gone}: update grpo_exp.trainer.seam / trl_surface"


def test_trls_fused_lm_head_takes_what_the_seam_passes_and_gives_each_tokens_log_probability(trl_trainer):
    """The seam's packed forward (HookedGRPOTrainer._fused_forward) calls the model TRL patched with
    `fused_lm_head=True` and `shift_labels`, and reads `log_probs` and `entropy`: they are the log-softmax at the
    trainer's temperature of each position's next token, and its entropy."""
    model = trl_trainer.model
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    with torch.no_grad():
        fused = model(input_ids=ids, shift_labels=labels, fused_lm_head=True)
        logits = model(input_ids=ids).logits / trl_trainer.temperature
    log_softmax = torch.log_softmax(logits.float(), dim=-1)
    expected = log_softmax[0, :-1].gather(-1, labels[0, :-1, None]).squeeze(-1)
    assert torch.allclose(fused.log_probs[0, :-1], expected, atol=1e-4)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)[0, :-1]
    assert torch.allclose(fused.entropy[0, :-1], entropy, atol=1e-4)


def test_the_loss_types_grpo_exp_passes_through_are_trls():
    """trainer.loss_type's names that go straight to TRL (grpo_exp.trainer.losses) are the ones GRPOConfig
    documents, and the GRPOConfig fields refused beside a loss of ours are GRPOConfig's."""
    import re

    from grpo_exp.trainer.losses import AGGREGATION, TRL_LOSS_ONLY, TRL_LOSS_TYPES

    documented = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    supported = documented.split("Supported values are")[1].split(". ")[0]
    assert set(TRL_LOSS_TYPES) == set(re.findall(r"'(\w+)'", supported)), supported
    assert AGGREGATION in TRL_LOSS_TYPES
    assert not [name for name in TRL_LOSS_ONLY if name not in GRPOConfig.__dataclass_fields__]


@pytest.mark.parametrize("name", TRL_VLLM_ATTRIBUTES)
def test_grpo_trainer_still_sets_what_the_seam_reads_of_its_vllm_generation(name):
    """Set only with use_vllm (no engine starts here): TRL's __init__ still assigns it."""
    assert f"self.{name} =" in inspect.getsource(GRPOTrainer.__init__), f"GRPOTrainer.{name} is gone"


def test_trls_fused_lm_head_reads_its_token_tile_where_grpo_exp_sets_it():
    """grpo_exp.trainer.lm_head_tile sets TRL's module constant: the kernel must still read it at each call, forward
    and backward (a constant copied at import, or renamed, would silently leave TRL's 4,096-token tile)."""
    import trl.kernels.chunked_logprob as kernel

    module, name = TRL_LM_HEAD_TILE
    assert module == kernel.__name__ and isinstance(getattr(kernel, name), int)
    source = inspect.getsource(kernel.ChunkedLogProbFunction)
    assert source.count(name) >= 2, f"{module}.{name} is no longer read in the forward and the backward"


def test_trls_fused_lm_head_asks_where_grpo_exp_answers_whether_to_score_labelled_positions_only():
    """grpo_exp.trainer.lm_head_positions wraps this module function: it must still be what the fused LM head asks,
    at each call, whether to score only the labelled positions, and nothing else of that module asks it (a kernel
    choice asking it would take Triton's kernel on CPU)."""
    module, name = TRL_LM_HEAD_COMPACT
    imported = importlib.import_module(module)
    assert callable(getattr(imported, name)), f"{module}.{name} is gone: update grpo_exp.trainer.lm_head_positions"
    source = inspect.getsource(imported)
    calls, uses = re.findall(rf"(\w+) = {name}\(", source), source.count(f"{name}(")
    assert calls == ["compact"] and uses == 1, f"{module}.{name} is now asked elsewhere too: {calls}, {uses} uses"


def test_trls_vllm_generation_is_where_grpo_exp_adjusts_it():
    """grpo_exp.trainer.vllm_reload subclasses TRL's VLLMGeneration, overriding and calling these methods, and builds
    it (and its engine) through these module names: an upgrade that moves them fails here, not in a vLLM run."""
    for module, names in TRL_VLLM_GENERATION.items():
        imported = importlib.import_module(module)
        for name in names:
            assert hasattr(imported, name), f"{module}.{name} is gone: update grpo_exp.trainer.vllm_reload"
    from trl.generation.vllm_generation import VLLMGeneration

    for method in VLLM_GENERATION_METHODS:
        assert callable(getattr(VLLMGeneration, method, None)), f"VLLMGeneration.{method} is gone"


def test_trls_vllm_generation_still_sets_what_the_async_pipeline_sends_the_server():
    """grpo_exp.trainer.async_generation builds TRL's server request from these (no engine starts here)."""
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration.__init__)
    missing = [name for name in VLLM_GENERATION_ATTRIBUTES if f"self.{name} =" not in source]
    assert not missing, f"VLLMGeneration no longer sets {missing}: update grpo_exp.trainer.async_generation"
