"""Policy losses (trainer.loss_type): TRL's own loss types by name, passed straight through to TRL; or a per-token
policy loss of grpo_exp's (@register_policy_loss) or of the user's, by import path (`module:name`).

The contract of a loss that is not TRL's, one call per micro-batch of the loss forward:

    f(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs) -> per-token loss [B, T]
                                                                                   (or (that, {metric: float}))

- per_token_logps [B, T]: each completion token's log-probability under the policy being trained (with gradient);
  old_per_token_logps [B, T]: the same under the policy that sampled it (no gradient; equal to per_token_logps'
  values on-policy, when trainer.num_iterations is 1); advantages [B]: one per completion (the `algorithm`'s);
  completion_mask [B, T]: 1 for the tokens the loss counts, 0 for padding (and tool output);
- kwargs: epsilon_low, epsilon_high (trainer.epsilon, +trainer.extra.epsilon_high: a clipping range), and any
  keyword grpo_exp adds later, so it must take **kwargs;
- it returns the policy-gradient term of each token, [B, T], a float tensor that depends on per_token_logps.

It replaces TRL's per-token term (clipping, importance ratio) and TRL's aggregation; what stays TRL's: the KL term
(trainer.beta * TRL's per-token k3 estimate against the reference model, added to each token), the vLLM importance
correction where TRL would apply it, and the metrics `kl` and `entropy`. The tokens are aggregated as TRL's `dapo`
does (every counted token of the step weighs the same: the sum over tokens divided by the step's token count, over
all processes), which GRPOConfig receives as its loss_type. A metrics dict returned beside the loss is logged as
`loss/<key>` (averaged over the logging step). Checked at resolve time, before any model loads, on a small batch.
"""

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig
from trl import GRPOConfig

from grpo_exp.errors import UserError
from grpo_exp.plugins import import_callable, signature_of, split_import_path
from grpo_exp.schema import ZeroVarianceGroups
from grpo_exp.trainer.trl_batch import loss_mask

# TRL 1.16's loss types (GRPOTrainer._compute_loss): passed straight through, TRL computes them.
TRL_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
# TRL's loss type whose aggregation a loss of ours is given (GRPOConfig.loss_type, the token count TRL gathers).
AGGREGATION = "dapo"
ARGUMENTS = ("per_token_logps", "old_per_token_logps", "advantages", "completion_mask")
CONTRACT = (
    "a policy loss is f(per_token_logps, old_per_token_logps, advantages, completion_mask, **kwargs) -> the per-token "
    "loss [B, T] (grpo_exp.trainer.losses)"
)
# GRPOConfig fields that act only inside TRL's own loss: a loss of ours would ignore them, so they are refused.
TRL_LOSS_ONLY = (
    "top_entropy_quantile",
    "off_policy_mask_threshold",
    "entropy_coef",
    "use_adaptive_entropy",
    "importance_sampling_level",
    "delta",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "use_bias_correction_kl",
)

# grpo_exp's own per-token losses, by name (none yet; TRL's are TRL_LOSS_TYPES).
POLICY_LOSSES: dict[str, Callable[..., Any]] = {}


def register_policy_loss(name: str) -> Callable:
    """Decorator: the function is the per-token policy loss `name` (trainer.loss_type=name), on the contract above."""

    def register(function: Callable) -> Callable:
        if name in POLICY_LOSSES or name in TRL_LOSS_TYPES:
            raise ValueError(f"a policy loss named {name!r} is already registered")
        POLICY_LOSSES[name] = function
        return function

    return register


def is_trls(name: str) -> bool:
    return name in TRL_LOSS_TYPES


def trl_loss_type(name: str) -> str:
    """What GRPOConfig.loss_type receives for trainer.loss_type=name."""
    return name if is_trls(name) else AGGREGATION


@functools.cache
def load_loss(name: str) -> Callable:
    """The policy loss `name`: registered, or imported from its path (the current directory importable)."""
    if name in POLICY_LOSSES:
        return POLICY_LOSSES[name]
    if ":" not in name and "." not in name:
        known = ", ".join([*TRL_LOSS_TYPES, *POLICY_LOSSES])
        raise UserError(
            f"trainer.loss_type={name}: no such loss; TRL's: {known}; or your own per-token loss by import path, "
            "module:name"
        )
    split_import_path(name, "trainer.loss_type")
    return import_callable(name, "trainer.loss_type", "a policy loss")


# ---- before any model loads ------------------------------------------------------------------------------------


def check_loss(trainer_cfg: DictConfig) -> None:
    """trainer.loss_type: TRL's, or a loss of ours whose signature and output on a small batch are right."""
    name = str(trainer_cfg.loss_type)
    if is_trls(name):
        return
    where = f"trainer.loss_type={name}"
    loss = load_loss(name)
    check_signature(loss, where)
    for key in TRL_LOSS_ONLY:
        if key in trainer_cfg.extra and trainer_cfg.extra[key] != GRPOConfig.__dataclass_fields__[key].default:
            raise UserError(
                f"trainer.extra.{key}={trainer_cfg.extra[key]} acts inside TRL's own loss, which {where} replaces: "
                "leave it out, or use one of TRL's loss types"
            )
    group_size = trainer_cfg.num_generations
    epsilon = trainer_cfg.epsilon
    kwargs = {"epsilon_low": epsilon, "epsilon_high": trainer_cfg.extra.get("epsilon_high") or epsilon}
    batch = sample_batch(2 * group_size)
    per_token, _ = call_loss(loss, where, batch, kwargs)
    if not per_token.requires_grad:
        raise UserError(f"{where}: its loss does not depend on per_token_logps (no gradient to train with): {CONTRACT}")
    skip = ZeroVarianceGroups(trainer_cfg.zero_variance_groups) is ZeroVarianceGroups.skip
    if skip:
        still = {**batch, "advantages": torch.zeros_like(batch["advantages"])}
        zero_advantage, _ = call_loss(loss, where, still, kwargs)
        if bool((zero_advantage * still["completion_mask"]).detach().abs().sum() > 0):
            raise UserError(
                f"{where}: a completion whose advantage is 0 gets a non-zero loss, but "
                "trainer.zero_variance_groups=skip leaves the groups with no reward spread (advantages all 0) out of "
                "the loss: use trainer.zero_variance_groups=keep with this loss"
            )


def check_signature(loss: Callable, where: str) -> None:
    signature = signature_of(loss)
    if signature is None:
        return
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        raise UserError(f"{where}: must accept **kwargs: {CONTRACT}; its signature is {signature}")
    try:
        signature.bind(**dict.fromkeys(ARGUMENTS), epsilon_low=0.2, epsilon_high=0.2)
    except TypeError as err:
        raise UserError(f"{where}: cannot be called as {CONTRACT}: {err}; its signature is {signature}") from None


def sample_batch(rows: int, width: int = 6) -> dict[str, torch.Tensor]:
    """A small synthetic batch as the loss receives one: log-probabilities, advantages of both signs, padding."""
    logps = torch.linspace(-3.0, -0.1, rows * width).view(rows, width).requires_grad_()
    mask = torch.ones(rows, width)
    mask[::2, width - 2 :] = 0.0  # every other completion shorter
    return {
        "per_token_logps": logps,
        "old_per_token_logps": logps.detach() - 0.05,
        "advantages": torch.tensor([(-1.0) ** i * (1 + i % 3) / 2 for i in range(rows)]),
        "completion_mask": mask,
    }


def call_loss(
    loss: Callable, where: str, batch: dict[str, torch.Tensor], kwargs: dict
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss on `batch`: (per-token loss [B, T], metrics), or one UserError naming the key."""
    try:
        result = loss(**batch, **kwargs)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's function fails: its error, in one line
        raise UserError(f"{where} raised {type(err).__name__}: {err}") from None
    return checked(result, tuple(batch["per_token_logps"].shape), where)


def checked(result: Any, shape: tuple[int, ...], where: str) -> tuple[torch.Tensor, dict[str, float]]:
    metrics: dict = {}
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        result, metrics = result
    if not isinstance(result, torch.Tensor):
        raise UserError(f"{where} returned a {type(result).__name__}, not a tensor: {CONTRACT}")
    if tuple(result.shape) != shape or not result.is_floating_point():
        raise UserError(
            f"{where} returned a {result.dtype} tensor of shape {tuple(result.shape)} for per_token_logps of shape "
            f"{shape}: {CONTRACT}"
        )
    if not bool(torch.isfinite(result.detach()).all()):
        raise UserError(f"{where} returned a loss that is not finite (nan or inf): {CONTRACT}")
    values = {}
    for key, value in metrics.items():
        number = float(value.detach()) if isinstance(value, torch.Tensor) else value
        if not isinstance(number, int | float) or not math.isfinite(number):
            raise UserError(f"{where} returned the metric {key}={value!r}: metrics are finite numbers")
        values[str(key)] = float(number)
    return result, values


# ---- training: the loss of one micro-batch (grpo_exp.trainer.seam delegates GRPOTrainer._compute_loss here) ------


def policy_loss(
    name: str,
    inputs: dict,
    loss_forward: Callable,
    epsilons: tuple[float, float],
    beta: float,
    processes: int,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss `name` (a loss of ours) on this micro-batch of TRL's generation batch: `loss_forward(input_ids,
    attention_mask, logits_to_keep)` gives each completion token's log-probability and entropy; TRL's KL term
    (`beta`) added, aggregated as dapo over the step's tokens on `processes` processes. Returns it and the metrics
    to record (`reduce_sum`: a sum over every process, a collective that every process calls)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logps, entropies = loss_forward(ids, attention, inputs["completion_ids"].size(1))
    mask = loss_mask(inputs)
    old = inputs.get("old_per_token_logps")
    batch = {
        "per_token_logps": logps,
        "old_per_token_logps": logps.detach() if old is None else old,
        "advantages": inputs["advantages"],
        "completion_mask": mask,
    }
    kwargs = {"epsilon_low": epsilons[0], "epsilon_high": epsilons[1]}
    per_token, returned = call_loss(load_loss(name), f"trainer.loss_type={name}", batch, kwargs)
    if inputs.get("importance_sampling_ratio") is not None:  # TRL's vLLM correction, where TRL computed one
        per_token = per_token * inputs["importance_sampling_ratio"]
    metrics = {}
    if beta != 0.0:
        ref = inputs["ref_per_token_logps"]
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token = per_token + beta * kl
        metrics["kl"] = global_masked_mean(kl, mask, reduce_sum)
    metrics["entropy"] = global_masked_mean(entropies, mask, reduce_sum)
    metrics |= {f"loss/{key}": value for key, value in returned.items()}
    tokens = inputs.get("num_items_in_batch")
    tokens = mask.sum() * processes if tokens is None else tokens
    return (per_token * mask).sum() / (tokens.clamp(min=1.0) / processes), metrics


def global_masked_mean(
    values: torch.Tensor, mask: torch.Tensor, reduce_sum: Callable[[torch.Tensor], torch.Tensor]
) -> float:
    """The mean of `values` over the counted tokens of every process (a collective: every process calls it)."""
    local = torch.stack([(values.detach() * mask).sum(), mask.sum().float()])
    total = reduce_sum(local)
    return (total[0] / total[1].clamp(min=1.0)).item()
