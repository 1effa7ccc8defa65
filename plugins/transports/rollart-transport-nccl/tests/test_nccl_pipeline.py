"""Transport "nccl" (gloo here, a push transport) on the real pipeline: in-process job,
every version broadcast from the trainer's rank 0 to two engines in a gloo group. The
engines join each version's round in the background while they keep generating on the
old one; the swap comes at a later suspend point; the staleness bound holds."""

from __future__ import annotations

import pytest

from rollart_sdk.testing.weight_sync import check_deferred, run_gated

pytestmark = pytest.mark.timeout(600)


def test_deferred_update_over_a_gloo_group(tmp_path):
    pytest.importorskip("rollart_engine_torch")
    job, records, gate = run_gated(tmp_path, "nccl", {"backend": "gloo", "timeout_s": 60,
                                                      "join_timeout_s": 120}, steps=5)
    overlapped = check_deferred(job, records, gate)
    assert len(overlapped) >= 2
