"""Transport "mooncake" on the real pipeline: in-process job, a real mooncake_master on
127.0.0.1, every version published once by the trainer and pulled by two engines into
registered buffers while they keep generating on the old one; the swap comes at a later
suspend point; the staleness bound holds."""

from __future__ import annotations

import pytest

from rollart_sdk.testing.weight_sync import check_deferred, run_gated

pytestmark = pytest.mark.timeout(600)


def test_deferred_update_through_a_mooncake_store(tmp_path, monkeypatch):
    for plugin in ("rollart_engine_torch", "rollart_trainer_torch", "rollart_env_frozenlake",
                   "rollart_env_arithmetic", "rollart_reward_rule"):
        pytest.importorskip(plugin)
    from rollart_transport_mooncake.transport import MooncakeTransport

    # Which versions the sender removed from the store while the run went on (close()
    # removes whatever is left: those are recorded apart).
    released: list[int] = []
    at_close: list[int] = []
    closing: list[bool] = []
    release, close = MooncakeTransport.release, MooncakeTransport.close

    def spy_release(self, version):
        (at_close if closing else released).append(version)
        release(self, version)

    def spy_close(self):
        if self.role == "sender":
            closing.append(True)
        close(self)

    monkeypatch.setattr(MooncakeTransport, "release", spy_release)
    monkeypatch.setattr(MooncakeTransport, "close", spy_close)
    job, records, gate = run_gated(tmp_path, "mooncake", steps=5)
    overlapped = check_deferred(job, records, gate)
    assert len(overlapped) >= 2
    # A version is removed once every engine committed a newer one: each commit of v
    # releases the version the engines served before it (version 0 is never published).
    committed = [int(e.split(":")[1]) for e in job.pipeline.log if e.startswith("update:")]
    before = [0, *committed[:-1]]
    assert released == [v for v in before if v], (released, committed)
    sender = job.pipeline.trainers[0].target.transport
    assert sender.published_versions == []  # closed: the rest released too
    assert committed[-1] in at_close  # the version still served was kept until the end
