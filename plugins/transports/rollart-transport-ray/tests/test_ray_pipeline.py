"""Transport "ray" on the real pipeline (in-process job, Ray's object store between the
trainer and two engines): the next version arrives while the engines keep generating on
the old one, the swap comes at a later suspend point, the staleness bound holds."""

from __future__ import annotations

import pytest
import ray

from rollart_sdk.ray_utils import init_ray
from rollart_sdk.testing.weight_sync import check_deferred, run_gated

pytestmark = pytest.mark.timeout(600)


def test_deferred_update_over_the_object_store(tmp_path):
    pytest.importorskip("rollart_engine_torch")
    init_ray(num_cpus=2)
    try:
        job, records, gate = run_gated(tmp_path, "ray", steps=5)
    finally:
        ray.shutdown()
    overlapped = check_deferred(job, records, gate)
    assert len(overlapped) >= 2
