"""Transport "mooncake" on the real pipeline: in-process job, a real mooncake_master on
127.0.0.1, every version published once by the trainer and pulled by two engines into
registered buffers while they keep generating on the old one; the swap comes at a later
suspend point; the staleness bound holds."""

from __future__ import annotations

import pytest

from rollart_sdk.testing.weight_sync import check_deferred, run_gated

pytestmark = pytest.mark.timeout(600)


def test_deferred_update_through_a_mooncake_store(tmp_path):
    for plugin in ("rollart_engine_torch", "rollart_trainer_torch", "rollart_env_frozenlake",
                   "rollart_env_arithmetic", "rollart_reward_rule"):
        pytest.importorskip(plugin)
    job, records, gate = run_gated(tmp_path, "mooncake", steps=5)
    overlapped = check_deferred(job, records, gate)
    assert len(overlapped) >= 2
    # Old versions are removed once every engine committed a newer one.
    sender = job.pipeline.trainers[0].target.transport
    assert sender.published_versions == []  # closed: everything released
