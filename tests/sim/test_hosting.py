"""The sim backends behind the real workers' seams: what a factory is offered, the
virtual-time env host's contract (the env hosts' errors, on virtual seconds), and the
weight stager receiving a transport on the event loop (the pull's time, a superseded
transfer)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollart_sdk.cluster.envs.errors import EnvCallError, EnvHung
from rollart_sdk.cluster.envs.virtual import VirtualEnvHost
from rollart_sdk.cluster.worker import WorkerContext, bound_worker_class
from rollart_sdk.errors import ConfigError
from rollart_sdk.registry import Descriptor
from rollart_sdk.sim import workloads as W
from rollart_sdk.sim.backends import SimEnv, SimEnvOptions, SimTransport, create_trainer
from rollart_sdk.sim.clock import run_virtual
from rollart_sdk.sim.engine import create_engine
from rollart_sdk.types import BucketRef, WeightManifest
from rollart_sdk.weights import WeightStager, WeightSyncError


def _descriptor(factory: Any, kind: str = "engine") -> Descriptor:
    return Descriptor(kind, "x", factory, None, "", "tests")


def test_an_offered_argument_reaches_only_a_factory_that_names_it() -> None:
    def named(model: Any = None, *, sim: Any = None) -> Any:
        return {"model": model, "sim": sim}

    def catch_all(model: Any = None, **options: Any) -> Any:
        return {"model": model, **options}

    offer = {"sim": "context", "binding": {"pool": "p"}}
    assert _descriptor(named).create(model="m", offer=offer) == {"model": "m", "sim": "context"}
    # **options takes no offer: a plugin's options stay the options it validated.
    assert _descriptor(catch_all).create(model="m", offer=offer) == {"model": "m"}


def test_sim_backends_outside_a_simulated_run_say_so() -> None:
    with pytest.raises(ConfigError, match="runs only on simulated time"):
        create_trainer(model=None)
    with pytest.raises(ConfigError, match="runs only on simulated time"):
        create_engine(model=None)


def _host(**env_options: Any) -> Any:
    """A VirtualEnvHost for task "T" (bound as the LocalSpawner binds a worker)."""
    desc = Descriptor("env", "sim", SimEnv, SimEnvOptions, "", "tests")
    ctx = WorkerContext(0, 1, "environment", "env", "env-0", {}, {})
    return bound_worker_class(VirtualEnvHost)(
        ctx, {"T": (desc, SimEnvOptions(**env_options))})


def test_virtual_env_host_sleeps_each_calls_latency_and_kills_a_hung_one() -> None:
    host = _host(reset_s=W.dist(mean=2.0), step_s=W.dist(mean=50.0), turns=W.dist(mean=3))

    async def main() -> tuple[float, float, str]:
        loop = asyncio.get_running_loop()
        obs, info = await host.reset("e1", "T", seed=1)
        after_reset = loop.time()
        with pytest.raises(EnvHung):  # modelled 50 s, timeout 30 s
            await host.step("e1", "act", timeout_s=30.0)
        return after_reset, loop.time(), obs

    (after_reset, after_step, obs), _ = run_virtual(main())
    assert after_reset == pytest.approx(2.0) and obs.startswith("sim-obs ")
    assert after_step == pytest.approx(2.0 + 30.0)  # given up at the timeout
    stats = asyncio.run(host.stats())
    assert stats["killed"] == 1 and stats["live"] == 0  # the hung env is gone


def test_virtual_env_hosts_env_error_is_an_env_call_error_after_its_latency() -> None:
    host = _host(reset_s=W.dist(mean=4.0), reset_failure=1.0)

    async def main() -> float:
        with pytest.raises(EnvCallError, match="SimEnvFailure: simulated reset failure"):
            await host.reset("e1", "T", seed=0)
        return asyncio.get_running_loop().time()

    elapsed, _ = run_virtual(main())
    assert elapsed == pytest.approx(4.0)


class _Engine:
    version = 0

    def __init__(self) -> None:
        self.loaded: list[int] = []

    async def load_weights(self, buckets: Any, version: int) -> int:
        self.loaded.append(version)
        self.version = version
        return 0


def _manifest(version: int, nbytes: int = 10**9) -> WeightManifest:
    return WeightManifest(version, "sim", [BucketRef(0, [], nbytes, "")], {"receivers": 1})


def test_stager_receives_on_the_loop_in_the_pulls_virtual_time() -> None:
    transport = SimTransport(role="receiver", pull_gbps=8.0, store_gbps=8.0, swap_s=0.0)
    stager, engine = WeightStager(transport), _Engine()

    async def main() -> tuple[dict[str, Any], dict[str, Any], Any]:
        stager.start(_manifest(1))  # 1 GB at 8 Gb/s: 1 s
        await asyncio.sleep(0.5)
        halfway = stager.status()
        done = await stager.wait()
        return halfway, done, await stager.commit(engine)

    (halfway, done, report), elapsed = run_virtual(main())
    assert halfway["ready"] is False and done["ready"] is True and done["error"] is None
    assert report.version == 1 and report.transfer_s == pytest.approx(1.0)
    assert elapsed == pytest.approx(1.0) and engine.loaded == [1]


def test_a_superseded_transfer_on_the_loop_fails_its_commit_not_the_caller() -> None:
    transport = SimTransport(role="receiver", pull_gbps=8.0, store_gbps=8.0)
    stager, engine = WeightStager(transport), _Engine()

    async def main() -> tuple[str, Any]:
        stager.start(_manifest(1))
        commit = asyncio.ensure_future(stager.commit(engine))
        await asyncio.sleep(0.1)
        stager.start(_manifest(2))  # supersedes version 1 while its commit waits
        with pytest.raises(WeightSyncError, match="superseded") as info:
            await commit
        return str(info.value), await stager.commit(engine)

    (why, report), _ = run_virtual(main())
    assert "superseded" in why and report.version == 2 and engine.loaded == [2]
