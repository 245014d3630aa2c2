"""Groups with no reward spread (trainer.zero_variance_groups), on TRL's generation batch (grpo_exp.trainer.trl_batch).

`skip` marks their rows so that the loss leaves them out, rescaled so that the update is TRL's; `resample` generates
more batches of fresh prompts until a step has enough groups with spread (DAPO's dynamic sampling). The seam
(grpo_exp.trainer.seam) calls these from its overrides of TRL's generation and loss.
"""

import logging
import random
from collections.abc import Callable, Iterable

import torch

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.schema import ZeroVarianceGroups
from grpo_exp.stats import zero_spread_groups
from grpo_exp.trainer.scored_batch import ScoredBatch
from grpo_exp.trainer.trl_batch import INFORMATIVE, concatenate, loss_scale, select_rows

# An advantage below this is the float noise of equal rewards divided by TRL's std + 1e-4, not a learning signal.
ADVANTAGE_NOISE = 1e-3
log = logging.getLogger(__name__)

# One scored generation batch: TRL's batch dict and, per group, whether it has no spread.
Scored = tuple[dict, torch.Tensor]


def check_zero_variance_groups(mode: ZeroVarianceGroups, processes: int) -> None:
    if mode is ZeroVarianceGroups.resample and processes > 1:
        raise UserError(
            f"trainer.zero_variance_groups=resample runs in one process only (this run has {processes}): "
            "use zero_variance_groups=skip"
        )


def no_spread_groups(batch: ScoredBatch) -> torch.Tensor:
    """[prompts] bool: groups without spread and with advantages that are zero (float noise aside). Under
    normalize_then_sum TRL normalises over the batch, so a group without spread still has equal, non-zero
    advantages, and it trains."""
    zero_advantages = batch.grouped(batch.advantages).abs().amax(dim=1) < ADVANTAGE_NOISE
    return zero_spread_groups(batch.grouped(batch.total)) & zero_advantages


def leaves_groups_out(
    mode: ZeroVarianceGroups, *, beta: float, entropy_bonus: bool, top_entropy_quantile: float, aux_loss: bool
) -> bool:
    """Whether no-spread groups are left out of the loss: with skip or resample, where rows with zero advantages
    add nothing to it. Not with a KL term (beta > 0), an entropy bonus, a high-entropy token mask or a router loss,
    which see every row: then every group trains, as in TRL (said in the log)."""
    if mode is ZeroVarianceGroups.keep:
        return False
    exact = beta == 0.0 and not entropy_bonus and top_entropy_quantile == 1.0 and not aux_loss
    if not exact:
        log.warning(
            "trainer.zero_variance_groups=%s leaves no group out: with beta > 0 (or an entropy term) "
            "a group without spread still moves the weights, so every group trains as in TRL",
            mode.value,
        )
    return exact


def informative_rows(no_spread: torch.Tensor, group_size: int, first_row: int, rows: int) -> torch.Tensor:
    """[rows] bool: False for the rows of a group without spread, for this process's `rows` rows from `first_row`
    of the gathered batch."""
    return ~no_spread.repeat_interleave(group_size)[first_row : first_row + rows]


def resample(
    first: Scored, groups: int, max_batches: int, generate: Callable[[int], Scored], pad_token_id: int, group_size: int
) -> tuple[Scored, dict[str, float]]:
    """DAPO's dynamic sampling: more batches (`generate(attempt)`, at most max_batches) until `groups` groups have a
    spread; the step trains on those, topped up with no-spread groups if the bound was hit. Returns the batch and
    its metrics."""
    batches = [first]
    with_spread = int((~first[1]).sum())
    while with_spread < groups and len(batches) <= max_batches:
        batches.append(generate(len(batches)))
        with_spread += int((~batches[-1][1]).sum())
    every_group = [(bool(flags[g]), b, g) for b, (_, flags) in enumerate(batches) for g in range(len(flags))]
    ranked = sorted(every_group)[:groups]  # groups with spread first, each in the order generated
    parts, chosen_flags = [], []
    for b, (batch, flags) in enumerate(batches):
        chosen = [g for _, batch_no, g in ranked if batch_no == b]
        if chosen:
            rows = torch.tensor([g * group_size + i for g in chosen for i in range(group_size)])
            parts.append(select_rows(batch, rows))
            chosen_flags.extend(bool(flags[g]) for g in chosen)
    metrics = {
        "resample/batches": float(len(batches)),
        "resample/groups_dropped": float(sum(len(flags) for _, flags in batches) - groups),
        "resample/bound_hit": float(with_spread < groups),
    }
    return (concatenate(parts, pad_token_id), torch.tensor(chosen_flags)), metrics


def fresh_inputs(dataset, groups: int, group_size: int, seed: int, step: int, attempt: int) -> list[dict]:
    """`groups` prompts of the training set, each repeated G times as TRL's sampler gives them; drawn from the
    seed, the step and the attempt, so a resumed run draws the same ones."""
    rng = random.Random(f"{seed}/{step}/{attempt}")
    indices = range(len(dataset))
    drawn = rng.sample(indices, groups) if len(dataset) >= groups else rng.choices(indices, k=groups)
    return [dataset[i] for i in drawn for _ in range(group_size)]


def resampler(generate: Callable, dataset, groups: int, group_size: int, seed: int, step: int) -> Callable:
    """zero_variance_groups=resample's source of more batches: attempt -> `generate` of `groups` fresh prompts
    (fresh_inputs)."""
    return lambda attempt: generate(fresh_inputs(dataset, groups, group_size, seed, step, attempt))


def informative_loss(
    inputs: dict,
    loss_type: str,
    trl_loss: Callable[..., torch.Tensor],
    parameters: Iterable[torch.nn.Parameter] | None,
    most_rows: Callable[[int], int] | None = None,
) -> torch.Tensor:
    """TRL's loss (`trl_loss(rows)`, or `trl_loss(rows, None)` without TRL's token count) over the rows not marked
    as no-spread, rescaled to TRL's normalisation: the same update for beta=0, without the forward/backward of the
    left-out rows. `parameters`: the trainable parameters where one unsharded process may skip the forward
    altogether; None where every process must run one (a collective in the wrapped model's forward/backward).
    `most_rows(rows)`: under several processes, the largest of every process's `rows` (a collective: every process
    calls it, every step); each process then takes that many rows, topped up with left-out rows whose advantages
    are zeroed, because TRL gathers per-row metrics and every process must hand it as many rows."""
    keep = inputs.get(INFORMATIVE)
    if keep is None:
        return trl_loss(inputs)
    if most_rows is not None:
        keep = topped_up(keep, most_rows(int(keep.sum())))
    if bool(keep.all()):
        return trl_loss(inputs)
    if not keep.any():
        # TRL's gradient is exactly zero here. Zero gradients rather than none, so that the optimiser takes the
        # same step TRL takes (Adam's moments still move the weights).
        if parameters is not None:
            return sum(p.view(-1)[0] * 0.0 for p in parameters if p.requires_grad)
        return trl_loss(select_rows(inputs, torch.tensor([0])), None) * 0.0
    informative, advantages = inputs[INFORMATIVE], inputs["advantages"]
    if advantages.dim() == 2:  # per token (rollout.turn_credit=discounted_return)
        informative = informative.unsqueeze(1)
    zeroed = {**inputs, "advantages": advantages.masked_fill(~informative, 0.0)}
    kept = select_rows(zeroed, keep.nonzero().squeeze(1))
    return trl_loss(kept) * loss_scale(loss_type, inputs, keep)


def topped_up(keep: torch.Tensor, rows: int) -> torch.Tensor:
    """`keep` with its first left-out rows added until `rows` rows are kept (at least the kept ones)."""
    missing = max(rows - int(keep.sum()), 0)
    fillers = (~keep).nonzero().squeeze(1)[:missing]
    return keep.clone().index_fill_(0, fillers, True)


def settle(
    scored: Scored,
    rows: int,
    group_size: int,
    mode: ZeroVarianceGroups,
    max_batches: int,
    generate: Callable[[int], Scored],
    pad_token_id: int,
    leave_out: bool,
    process_index: int,
) -> tuple[dict, dict[str, float]]:
    """A training step's batch, its no-spread groups settled: resampled (`generate(attempt)` gives a fresh batch of
    as many groups), then, when `leave_out`, marked for the loss to leave out (this process's `rows` rows of the
    gathered batch). Returns TRL's batch and the metrics to record."""
    output, no_spread = scored
    metrics: dict[str, float] = {}
    if mode is ZeroVarianceGroups.resample:
        groups = rows // group_size
        (output, no_spread), metrics = resample(scored, groups, max_batches, generate, pad_token_id, group_size)
    if leave_out:
        keep = informative_rows(no_spread, group_size, process_index * rows, rows)
        output[INFORMATIVE] = keep.to(output["advantages"].device)
        metrics["zero_variance/groups_left_out"] = float(no_spread.sum())
    return output, metrics


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("trainer.max_resample_batches",),
        lambda cfg: cfg.trainer.zero_variance_groups is ZeroVarianceGroups.resample,
        "by dynamic sampling (trainer.zero_variance_groups=resample)",
        lambda cfg: f"trainer.zero_variance_groups={cfg.trainer.zero_variance_groups.value} generates no extra batch",
        "set trainer.zero_variance_groups=resample too",
    ),
)
