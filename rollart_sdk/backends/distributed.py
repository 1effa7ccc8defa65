"""torch.distributed for trainer backends: the process group a trainer's ranks join, the
small collectives every trainer step takes, and GRPO advantages over a whole batch that
is sharded over ranks. Trainers ``torch`` and ``megatron`` both use these.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rollart_sdk.algorithms import fill_advantages
from rollart_sdk.algorithms.advantages import Estimator
from rollart_sdk.types import TrainSample


def check_rank(rank: int, world_size: int) -> tuple[int, int]:
    """``(rank, world_size)`` as ints, checked: a trainer's rank is in ``[0, world_size)``."""
    rank, world_size = int(rank), int(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"trainer rank {rank} is outside world_size {world_size}")
    return rank, world_size


def init_process_group(rank: int, world_size: int, init_method: str | None, backend: str,
                       cuda: bool, *, timeout: timedelta | None = None,
                       what: str = "data parallelism") -> None:
    """Join (or create) the default process group as ``rank`` of ``world_size``.

    Already initialised (another trainer in this process): checked to be the same rank
    and size. ``init_method`` (``tcp://HOST:PORT`` or ``file:///shared/path``) is needed
    for more than one rank; one rank without it gets a private file rendezvous.
    ``backend`` ``auto``: nccl on CUDA, gloo on the CPU."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(
                f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, but this trainer is rank {rank} of {world_size}"
            )
        return
    if world_size > 1 and not init_method:
        raise ValueError(
            f"trainer rank {rank} of {world_size}: {what} needs init_method "
            "(tcp://HOST:PORT reachable by every rank, or file:///shared/path)"
        )
    if init_method is None:  # one rank: a private rendezvous (megatron-core needs a group)
        init_method = f"file://{tempfile.mkdtemp(prefix='rollart-trainer-')}/init"
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timeout)


def all_reduce_small(t: torch.Tensor, device: torch.device, group: Any = None,
                     op: str = "sum") -> torch.Tensor:
    """Sum (``op="max"``: the maximum of) a small CPU tensor over ``group``'s ranks, on
    ``device`` (nccl reduces CUDA tensors only); the tensor itself with one rank."""
    if dist.get_world_size(group) == 1:
        return t
    x = t.to(device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM,
                    group=group)
    return x.cpu()


def all_reduce_flat(tensors: list[torch.Tensor], group: Any = None) -> None:
    """Sum ``tensors`` over ``group`` in place, as one flat collective."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def fill_advantages_across(batch: list[TrainSample], eps: float, normalize_std: bool,
                           device: torch.device, *, size: int, rank: int,
                           group: Any = None, estimator: Estimator = "grpo") -> None:
    """Advantages (:func:`~rollart_sdk.algorithms.fill_advantages`, ``estimator``) for
    the samples without one, over the batch of all ``size`` ranks of ``group`` (this one
    ``rank``): rewards (and trained-token counts) are gathered, so a group split over
    ranks is normalised as a whole, and a batch whitening sees the whole batch. Every
    rank takes part in the same collectives, needed or not (lockstep)."""
    if size == 1:
        fill_advantages(batch, eps, normalize_std, estimator)
        return
    need = any(s.advantage is None for s in batch)
    if not all_reduce_small(torch.tensor([float(need)]), device, group, "max")[0]:
        return
    whiten = estimator == "reinforce_pp_baseline"  # the only one that needs token counts
    mine = [(s.reward, s.group_id, s.advantage, s.trajectory_id, s.segment,
             sum(s.loss_mask) if whiten else 0) for s in batch]
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, mine, group=group)
    rows = [row for part in gathered for row in part]
    full = [TrainSample([], [], [], [], reward=r, group_id=g, advantage=a, trajectory_id=t,
                        segment=k)
            for r, g, a, t, k, _ in rows]
    fill_advantages(full, eps, normalize_std, estimator, tokens=[row[5] for row in rows])
    offset = sum(len(part) for part in gathered[:rank])
    for s, f in zip(batch, full[offset : offset + len(batch)], strict=True):
        s.advantage = f.advantage
