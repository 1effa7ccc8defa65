"""The weight-update process group: a standalone torch.distributed group in its own store.

It is built straight from ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` on a
``PrefixStore`` of the transport's own ``TCPStore``; nothing here calls
``init_process_group``, so the trainer's data-parallel group and an engine's
tensor-parallel group (whatever default group a process has) are never touched.
Every operation waits with a timeout: a dead peer makes it raise, never hang.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any, Literal

Backend = Literal["auto", "nccl", "gloo"]
Abort = Callable[[], "str | None"]

# Groups given up on while a collective was still pending: a process group's destructor
# waits for its pending work, which ends only at the group's own timeout, so they are kept
# here instead of blocking the thread that noticed the failure.
_ABANDONED: list[Any] = []


class PeerFailed(RuntimeError):
    """Another member of the round reported a failure; waiting on would only time out."""


def abandon(group: Any) -> None:
    if group is not None:
        _ABANDONED.append(group)


def choose_backend(requested: Backend) -> str:
    """``auto``: nccl when this process sees a GPU and torch has NCCL, else gloo."""
    import torch
    import torch.distributed as dist

    if requested == "gloo":
        return "gloo"
    nccl_ok = torch.cuda.is_available() and dist.is_nccl_available()
    if requested == "nccl":
        if not nccl_ok:
            raise RuntimeError(
                "transport nccl: backend='nccl' needs a CUDA GPU and a torch built with "
                "NCCL in every process; set transport.options.backend=gloo (or auto) on CPU"
            )
        return "nccl"
    return "nccl" if nccl_ok else "gloo"


def device_for(backend: str) -> Any:
    """Where buffers live: the current GPU for nccl, the CPU for gloo."""
    import torch

    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def new_group(store: Any, prefix: str, rank: int, world: int, backend: str,
              timeout_s: float) -> Any:
    """A process group of ``world`` ranks under ``prefix`` in ``store`` (blocks until every
    rank arrived or ``timeout_s`` passed)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    scoped = dist.PrefixStore(prefix, store)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(scoped, rank, world, opts)
    return dist.ProcessGroupGloo(scoped, rank, world, timeout)


def _wait(work: Any, timeout_s: float, abort: Abort | None) -> None:
    """Wait for ``work``; raise on its error, after ``timeout_s``, or as soon as ``abort()``
    names a reason (checked every 0.1 s: a peer that failed said so in the store)."""
    if abort is None:
        work.wait(datetime.timedelta(seconds=timeout_s))
        return
    start = time.monotonic()
    next_check, nap = start, 0.0005
    while not work.is_completed():
        now = time.monotonic()
        if now - start > timeout_s:
            raise TimeoutError(f"the collective did not complete within {timeout_s}s")
        if now >= next_check:
            reason = abort()
            if reason:
                raise PeerFailed(reason)
            next_check = now + 0.1
        time.sleep(nap)
        nap = min(nap * 2, 0.01)
    work.wait(datetime.timedelta(seconds=timeout_s))  # raises the work's own error


def broadcast(group: Any, tensor: Any, timeout_s: float, abort: Abort | None = None) -> None:
    """Broadcast ``tensor`` from rank 0 of ``group`` (in place on the other ranks)."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    _wait(group.broadcast([tensor], opts), timeout_s, abort)


def barrier(group: Any, device: Any, timeout_s: float, abort: Abort | None = None) -> None:
    """Every rank reached this point (an all-reduce of one number)."""
    import torch

    one = torch.ones(1, device=device)
    _wait(group.allreduce([one]), timeout_s, abort)
    if int(one.item()) != group.size():
        raise RuntimeError(f"barrier counted {int(one.item())} of {group.size()} ranks")
