"""``rollart_engine_sglang.scheduler``, the code SGLang's scheduler process runs for the
collective path, driven directly in this process (fast; the real scheduler process runs
it in test_collective.py): a real ``NcclTransport`` round over gloo into its staging, the
checks, and the one-call load. The model here records ``load_weights`` (SGLang's model
classes need SGLang's runtime); on the real engine the served weights are compared.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from rollart_engine_sglang import scheduler

from rollart_sdk.weights import plan_manifest, split_buckets
from rollart_sdk.weights.direct import manifest_to_json

needs_nccl = pytest.mark.skipif(importlib.util.find_spec("rollart_transport_nccl") is None,
                                reason="the nccl transport plugin is not installed")
pytestmark = pytest.mark.timeout(120)
EMBED = "model.embed_tokens.weight"


class Model:
    def __init__(self) -> None:
        self.calls: list[list[tuple[str, Any]]] = []

    def load_weights(self, weights: list[tuple[str, Any]]) -> None:
        self.calls.append(list(weights))


@pytest.fixture(autouse=True)
def fresh_state():
    yield
    staging = scheduler._state["staging"]
    if staging is not None:
        staging.close()
    scheduler._state.update(staging=None, ready=None, result=None, shapes={})


def rpc(method: str, **params: Any) -> Any:
    """What SGLang's RPC handler does with the hook installed: the answer it sends back."""
    request = SimpleNamespace(method=method, parameters=params)
    return scheduler.around_rpc(lambda *a: pytest.fail("went to SGLang's handler"), None,
                                request)


def test_the_hook_answers_rollart_rpcs_and_passes_the_others_on():
    seen = []
    out = scheduler.around_rpc(lambda sched, req: seen.append(req.method) or "theirs", "S",
                               SimpleNamespace(method="save_remote_model", parameters={}))
    assert out == "theirs" and seen == ["save_remote_model"]
    ping = rpc("rollart_ping")
    assert ping.success and json.loads(ping.message) == {"loader": scheduler.LOADER}
    bad = rpc("rollart_nope")
    assert not bad.success and "unknown rollart RPC 'rollart_nope'" in bad.message
    nothing = rpc("rollart_check", version=3, checkpoint="/nowhere")
    assert not nothing.success and "WeightSyncError" in nothing.message


def test_load_staged_without_a_checked_version_loads_nothing():
    model = Model()
    scheduler.load_staged(model, [(scheduler.MARKER, torch.tensor([4]))])
    assert model.calls == []
    answer = rpc("rollart_result", version=4)
    assert not answer.success and "not staged and checked" in answer.message


def stage_round(version: int, state: dict[str, torch.Tensor]) -> Any:
    """A real nccl sender (gloo) publishing ``state``; the scheduler side stages it."""
    from rollart_transport_nccl.transport import NcclTransport

    sender = NcclTransport("sender", backend="gloo", receivers=1, timeout_s=60,
                           join_timeout_s=60)
    spec = NcclTransport("receiver", store=sender.address, receivers=1).receiver_spec()
    buckets = list(split_buckets(state.items(), bucket_bytes=20_000, version=version))
    assert rpc("rollart_stage", manifest=manifest_to_json(
        plan_manifest(version, "nccl", buckets)), spec=json.dumps(spec)).success
    thread = threading.Thread(target=sender.publish, args=(version, buckets), daemon=True)
    thread.start()
    thread.join(60)
    sender.wait(60)
    for _ in range(600):
        status = json.loads(rpc("rollart_status").message)
        if status["ready"]:
            break
        threading.Event().wait(0.05)
    sender.close()
    return status


@needs_nccl
def test_a_round_is_staged_checked_then_loaded_in_one_call(tiny_model, other_weights):
    status = stage_round(1, other_weights)
    assert status == {**status, "version": 1, "ready": True, "error": None}
    model = Model()
    checked = rpc("rollart_check", version=1, checkpoint=tiny_model.path)
    assert checked.success and json.loads(checked.message) == len(other_weights)
    assert model.calls == []  # nothing loaded before the commit
    scheduler.load_staged(model, [(scheduler.MARKER, torch.tensor([1]))])
    assert len(model.calls) == 1 and len(model.calls[0]) == len(other_weights)
    loaded = dict(model.calls[0])
    torch.testing.assert_close(loaded[EMBED], other_weights[EMBED])
    assert json.loads(rpc("rollart_result", version=1).message) == len(other_weights)


@needs_nccl
def test_a_misfit_is_refused_at_the_check_and_dropped(tiny_model, other_weights):
    state = dict(other_weights)
    state[EMBED] = state[EMBED][:-1].clone()
    assert stage_round(2, state)["error"] is None  # it arrived intact
    checked = rpc("rollart_check", version=2, checkpoint=tiny_model.path)
    assert not checked.success and "shape" in checked.message and EMBED in checked.message
    model = Model()
    scheduler.load_staged(model, [(scheduler.MARKER, torch.tensor([2]))])
    assert model.calls == [] and not rpc("rollart_result", version=2).success


def test_on_cpu_the_receiver_spec_is_used_as_it_is():
    spec = {"factory": "x:Y", "kwargs": {}}
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the spec is wrapped in OnDevice")
    assert scheduler.on_scheduler_device(spec) is spec
