"""``keep_freed_memory``: a worker process reuses freed blocks instead of faulting in new
pages for every step's activations (glibc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, resource
from rollart_sdk.cluster.worker import keep_freed_memory
kept = keep_freed_memory()
faults = []
for _ in range(4):  # a step's few-MB activation, allocated, written and freed each time
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = bytearray(6 * 2**20)
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def _probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items()
             if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env},
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_new_page_faults() -> None:
    kept = _probe()
    assert kept["kept"] is True
    # 6 MiB is 1,536 pages. Kept: every round after the first reuses the freed block.
    # glibc's default: the first block is an mmap given back at free, and the second
    # comes from new heap pages (glibc raises its mmap threshold only after that free):
    # faulted in again. (Later rounds of one size settle; a step's many sizes keep
    # moving that threshold and the heap's top, measured in docs/benchmarks.md.)
    assert max(kept["faults"][1:]) < 100, kept  # type: ignore[index]
    default = _probe(ROLLART_MALLOC="default")
    assert default["kept"] is False
    assert default["faults"][1] > 1000, default  # type: ignore[index]
    # A user's own allocator settings are left alone.
    assert _probe(GLIBC_TUNABLES="glibc.malloc.arena_max=2")["kept"] is False
