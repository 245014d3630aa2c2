"""Evaluation work split over the processes of a run (accelerate launch, torchrun, a Slurm job): each process
takes whole batches of the items, and every process gets every result, in order.

Whole batches, as one process would form them: a batch is padded, and so computed, exactly as in a one-process
evaluation (greedy results are the same). Every process runs as many batches, repeating one where it has fewer:
a sharded model (FSDP, DeepSpeed ZeRO-3) gathers its weights in every forward, from every process together.
"""

import math
from collections.abc import Callable

from grpo_exp.errors import UserError


def process_layout() -> tuple[int, int]:
    """(this process's rank, the number of processes); (0, 1) outside a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def batches_of(count: int, batch_size: int, rank: int, processes: int) -> tuple[range, int]:
    """The items (by index) of `count` that process `rank` works on, and how many batches every process runs.

    Pure: contiguous whole batches, as evenly as possible, the first processes taking one more where they differ."""
    batches = math.ceil(count / batch_size)
    per_process, extra = divmod(batches, processes)
    first = rank * per_process + min(rank, extra)
    mine = per_process + (rank < extra)
    start, stop = first * batch_size, min((first + mine) * batch_size, count)
    return range(min(start, count), stop), per_process + (extra > 0)


def map_over_processes(items: list, batch_size: int, work: Callable[[list, bool], list]) -> list:
    """`work(items, main)` (one result per item; main: whether this is the process that shows progress) on this
    process's batches; all results, in the order of `items`, on every process."""
    rank, processes = process_layout()
    if processes == 1:
        return work(items, True)
    from accelerate.utils import gather_object

    indices, batches = batches_of(len(items), batch_size, rank, processes)
    results = work([items[i] for i in indices], rank == 0) if len(indices) else []
    for _ in range(batches - math.ceil(len(indices) / batch_size)):  # the same forwards on every process
        work(items[:batch_size], False)
    return gather_object(results)  # every process's list, concatenated in rank order


def sum_over_processes(values: list[float]) -> list[float]:
    """Element-wise sums over every process of the run (each passes as many values), on every process."""
    if process_layout()[1] == 1:
        return list(values)
    from accelerate.utils import gather_object

    return [sum(column) for column in zip(*gather_object([list(values)]), strict=True)]


def from_main_process(compute: Callable[[], object]) -> object:
    """`compute()` on the main process alone (a judge's requests: once), its result on every process. Where it
    refuses the user's input (UserError), every process raises the refusal, each naming what to change, instead of
    the others failing in the collective they wait in."""
    rank, processes = process_layout()
    if processes == 1:
        return compute()
    from accelerate.utils import broadcast_object_list

    result, refusal = None, None
    if rank == 0:
        try:
            result = compute()
        except UserError as err:
            refusal = err
    result, message = broadcast_object_list([(result, None if refusal is None else str(refusal))])[0]
    if refusal is not None:
        raise refusal
    if message is not None:
        raise UserError(message)
    return result
