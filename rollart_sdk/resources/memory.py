"""Host memory of a process whose tensors live on the CPU: freed blocks kept for reuse.

glibc's ``malloc`` serves a block above its mmap threshold (128 KiB, raised as such blocks
are freed, at most 32 MiB) with a fresh mapping and returns it to the kernel on ``free``;
the next such ``malloc`` maps again and every page of it faults in again, zeroed by the
kernel. Freed memory at the top of the heap is returned the same way (the trim
threshold). A train step of SmolLM2-135M on the CPU allocates about 400 MB of such blocks
(the logits over the 49,152-token vocabulary and their gradient, the activations): about
100,000 page faults a step, 0.15 s of kernel time in one process and 0.3-1.7 s in a Ray
actor, where they made the train step twice the in-process one (docs/benchmarks.md,
"Page faults").

:func:`keep_freed_memory` turns both off for the process (``mallopt``): every block comes
from the heap and stays there when freed, so a step reuses the memory the step before
freed and faults nothing after the first few. The process keeps its working size instead
of shrinking between steps (SmolLM2 over 60 steps in process: flat at 4.57 GB, against
4.72-5.07 GB before, when fresh mappings of two steps were sometimes in flight at once).
Torch aligns its blocks to 64 bytes and glibc pads an aligned request, so a block does
not fit the exact hole its predecessor left: the heap grows by a few blocks until
neighbouring holes merge, then stops. A heap of another thread (an "arena") maps a block
larger than 64 MiB whatever the settings, so ``one_arena`` puts every thread created
afterwards on the main heap: an in-process run sets it before its workers' threads start.

Applied where tensors live in host memory: on a machine without a GPU device, in the
in-process layout (``LocalSpawner``) and in the engine and trainer workers of the Ray
layout. On a GPU the tensors are in device memory (CUDA's caching allocator reuses them) and a
process's host peaks (a checkpoint read into memory) should go back to the system, so it
is left alone. ``ROLLART_KEEP_FREED_MEMORY=0`` turns it off, ``=1`` on even with a GPU.
Other C libraries (musl, macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform

from rollart_sdk.errors import RollartError

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

ENV = "ROLLART_KEEP_FREED_MEMORY"

_state: dict[str, bool] = {"applied": False, "one_arena": False}


def wanted() -> bool:
    """Whether this process should keep freed memory: ``ROLLART_KEEP_FREED_MEMORY``
    when set, else when no GPU device is visible (tensors in host memory). Looks for the
    device files, without initialising CUDA (a process that forks later must not have)."""
    env = os.environ.get(ENV, "").strip().lower()
    if env:
        if env not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
            raise RollartError(f"{ENV}={env!r}: use 1 (keep freed memory) or 0 (leave "
                               "glibc's malloc as it is)")
        return env in ("1", "true", "yes", "on")
    return not gpu_visible()


def gpu_visible() -> bool:
    """A GPU device file in this process's view: NVIDIA's, AMD's (``/dev/kfd``) or WSL's."""
    return (any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg"))
            or bool(glob.glob("/dev/nvidia[0-9]*")))


def keep_freed_memory(one_arena: bool = False) -> bool:
    """Keep freed heap memory for reuse in this process when :func:`wanted` says so
    (glibc only): no fresh mappings for large blocks, no trimming of the heap's top,
    and with ``one_arena`` every thread created afterwards on the main heap. Returns
    whether the settings are in force; calling it again is harmless."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or not wanted():
        return False
    if _state["applied"] and (_state["one_arena"] or not one_arena):
        return True
    libc = ctypes.CDLL(None)
    ok = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1)))
    if ok and one_arena:
        _state["one_arena"] = bool(libc.mallopt(M_ARENA_MAX, 1))
    _state["applied"] = ok
    return ok


def describe() -> dict[str, bool]:
    """What this process set (``plan.json``'s ``host_memory``)."""
    return {"keep_freed": _state["applied"], "one_arena": _state["one_arena"]}
