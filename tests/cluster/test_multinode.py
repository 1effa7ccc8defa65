"""The resource and data planes on a real multi-node Ray cluster (ray.cluster_utils).

Three nodes on 127.0.0.1, each standing for a hardware pool through a custom resource
``pool:<name>`` and a node label ``hardware=<name>``: H800 (2 slots), H20 (4 slots) and
cpu (8 slots, the head node). Nodes have one CPU each; workers reserve pool slots, not CPUs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from types import SimpleNamespace

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import pytest
import ray
from ray import cloudpickle

from rollart_sdk.cluster import (
    ActorGenWorker,
    ActorTrainWorker,
    Cluster,
    EnvironmentWorker,
    RewardWorker,
    hw_mapping,
    register,
    register_serverless,
    serve_function,
)
from rollart_sdk.config import PoolConfig
from rollart_sdk.errors import PlacementError
from rollart_sdk.resources import ResourceManager, read_bindings

# Worker classes below live in this test module; ship them to Ray workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def pools(serverless_url: str | None = None) -> list[PoolConfig]:
    out = [
        PoolConfig(name="H800", hardware="H800", profile="compute", count=2,
                   labels={"hardware": "H800"}),
        PoolConfig(name="H20", hardware="H20", profile="bandwidth", count=4,
                   labels={"hardware": "H20"}),
        PoolConfig(name="cpu", hardware="cpu", kind="cpu", count=8, labels={"hardware": "cpu"}),
    ]
    if serverless_url:
        out.append(PoolConfig(name="fc", hardware="serverless", kind="serverless",
                              url=serverless_url, count=4))
    return out


@pytest.fixture(scope="module")
def rc():
    from ray.cluster_utils import Cluster as RayCluster

    from rollart_sdk.ray_utils import init_ray

    c = RayCluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=1, resources={"pool:cpu": 8}, labels={"hardware": "cpu"},
                            include_dashboard=False, node_ip_address="127.0.0.1"),
    )
    h800 = c.add_node(num_cpus=1, resources={"pool:H800": 2}, labels={"hardware": "H800"},
                      node_ip_address="127.0.0.1")
    h20 = c.add_node(num_cpus=1, resources={"pool:H20": 4}, labels={"hardware": "H20"},
                     node_ip_address="127.0.0.1")
    c.wait_for_nodes(timeout=60)
    init_ray(address=c.address)
    labels = {n["NodeID"]: n["Labels"].get("hardware") for n in ray.nodes() if n["Alive"]}
    yield SimpleNamespace(cluster=c, h800=h800, labels=labels,
                          node_of={"H800": h800.node_id, "H20": h20.node_id,
                                   "cpu": c.head_node.node_id})
    ray.shutdown()
    c.shutdown()


# --------------------------------------------------------------------------- workers


class Trainer(ActorTrainWorker):
    def __init__(self, scale: int = 1) -> None:
        self.scale = scale  # rank and binding are already set when __init__ runs
        self.seen_rank = self.rank

    @register(mode="execute_all")
    def where(self) -> dict:
        return {"node": ray.get_runtime_context().get_node_id(), "rank": self.rank,
                "seen_rank": self.seen_rank, "pool": self.binding["pool"]}

    @register(mode="dp_split", collect="concat")
    def double(self, batch: list[int]) -> list[int]:
        return [x * 2 * self.scale for x in batch]

    @register(mode="dp_split")
    def shard(self, batch: list[int]) -> tuple[int, list[int]]:
        return self.rank, batch

    @register(mode="rank0")
    def leader(self) -> int:
        return self.rank


class Env(EnvironmentWorker):
    @register(mode="execute_all")
    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()


class HeteroActorGen(ActorGenWorker):
    """The paper's Listing 1 example, async (engines run on an event loop)."""

    @hw_mapping(hw_affinity={"FrozenLake": "H800", "default": "H20"})
    async def generate(self, input_ids: list[int], tag_name: str = "default") -> dict:
        await asyncio.sleep(0)
        return {"rank": self.rank, "pool": self.binding["pool"],
                "node": ray.get_runtime_context().get_node_id(), "n": len(input_ids)}

    @register(mode="execute_all")
    async def ping(self) -> int:
        return self.rank


def score_pure(traj: list[str]) -> float:
    """The pure reward function the endpoint runs (fraction of 'good' steps)."""
    return sum(1 for t in traj if t == "good") / max(1, len(traj))


def make_serverless_worker(url: str) -> type:
    class Reward(RewardWorker):
        @register_serverless(attribute="reward_proxy", serverless_url=url)
        def compute_rewards(self, traj: list[str]) -> dict:
            return {"score": self.reward_proxy(traj), "pid": os.getpid()}

        @register(mode="one")
        async def compute_async(self, traj: list[str]) -> float:
            return await self.reward_proxy.acall(traj)

    return Reward


class PoolReward(RewardWorker):
    """serverless_url=None: the URL of the serverless pool the worker is bound to."""

    @register_serverless(attribute="reward_proxy")
    def compute_rewards(self, traj: list[str]) -> float:
        return self.reward_proxy(traj)


# --------------------------------------------------------------------------- tests


def test_roles_land_on_their_paper_default_pools(rc):
    rm = ResourceManager(pools(), namespace="t-roles")
    train = Cluster(Trainer, resource_manager=rm, num_workers=2, init_kwargs={"scale": 3})
    env = Cluster(Env, resource_manager=rm, num_workers=3)
    try:
        out = train.where()
        assert [o["rank"] for o in out] == [0, 1]
        assert [o["seen_rank"] for o in out] == [0, 1]  # context set before __init__
        assert {rc.labels[o["node"]] for o in out} == {"H800"}
        assert {o["pool"] for o in out} == {"H800"}
        assert {rc.labels[n] for n in env.where()} == {"cpu"}
        for w in train.workers:
            assert w.binding.pool == w.binding.preferred == "H800" and not w.binding.fallback
            assert w.node_id == rc.node_of["H800"] == w.binding.node_id
        # data-parallel split: contiguous shards per rank, concatenated back in order
        assert train.double(list(range(7))) == [x * 6 for x in range(7)]
        assert train.shard(list(range(5))) == [(0, [0, 1, 2]), (1, [3, 4])]
        assert train.leader() == 0
        # records are in the GCS, readable by anyone connected
        recs = {b.worker: b for b in read_bindings("t-roles")}
        assert {recs[w.name].pool for w in env.workers} == {"cpu"}
        assert recs[train.workers[1].name].node_id == rc.node_of["H800"]
    finally:
        train.shutdown()
        env.shutdown()
    assert read_bindings("t-roles") == []


def test_hw_mapping_routes_frozenlake_to_h800_and_others_to_h20(rc):
    rm = ResourceManager(pools(), namespace="t-hw")
    gen = Cluster(HeteroActorGen, resource_manager=rm, workers_per_pool={"H800": 2, "H20": 4})
    try:
        assert sorted(gen.ping()) == list(range(6))
        pool_of = {w.rank: w.pool for w in gen.workers}
        assert Counter(pool_of.values()) == {"H800": 2, "H20": 4}
        fl = [gen.generate([1, 2, 3], tag_name="FrozenLake") for _ in range(24)]
        assert {r["pool"] for r in fl} == {"H800"}
        assert {rc.labels[r["node"]] for r in fl} == {"H800"}
        assert Counter(r["rank"] for r in fl) == {r: 12 for r, p in pool_of.items() if p == "H800"}
        other = [gen.generate([1], tag_name="Sokoban") for _ in range(24)]
        other += [gen.generate([1], "GEM-math") for _ in range(8)]  # tag passed positionally
        assert {r["pool"] for r in other} == {"H20"}
        assert {rc.labels[r["node"]] for r in other} == {"H20"}
        assert Counter(r["rank"] for r in other) == {r: 8 for r, p in pool_of.items() if p == "H20"}
        assert {w.pool for w in gen.workers_for_tag("generate", "FrozenLake")} == {"H800"}
        assert len(gen.workers_for_tag("generate", "WebShop")) == 4

        async def many() -> list[dict]:
            refs = [gen.generate.refs([0] * i, tag_name="FrozenLake") for i in range(6)]
            return list(await asyncio.gather(*refs))

        got = asyncio.run(many())
        assert [r["n"] for r in got] == list(range(6)) and {r["pool"] for r in got} == {"H800"}
    finally:
        gen.shutdown()


def test_fallback_when_preferred_pool_full_is_recorded_and_used_for_routing(rc):
    rm = ResourceManager(pools(), namespace="t-fallback")
    hog = Cluster(Trainer, resource_manager=rm, num_workers=2, name="hog")  # fills H800
    gen = None
    try:
        assert {w.pool for w in hog.workers} == {"H800"}
        gen = Cluster(HeteroActorGen, resource_manager=rm, workers_per_pool={"H800": 1, "H20": 1})
        fb, native = gen.workers
        assert (fb.binding.preferred, fb.binding.pool, fb.binding.fallback) == ("H800", "H20", True)
        assert "fell back" in fb.binding.reason and "H800" in fb.binding.reason
        assert fb.node_id == rc.node_of["H20"]
        assert not native.binding.fallback
        rec = {b.worker: b for b in read_bindings("t-fallback")}[fb.name]
        assert (rec.preferred, rec.actual, rec.fallback) == ("H800", "H20", True)
        # FrozenLake goes to the worker that was meant for H800 (the recorded fallback)
        assert {gen.generate([1], tag_name="FrozenLake")["rank"] for _ in range(6)} == {fb.rank}
        # other tags go to whatever runs on H20, the fallback worker included
        assert {gen.generate([1], tag_name="other")["rank"] for _ in range(6)} == {0, 1}
    finally:
        if gen is not None:
            gen.shutdown()
        hog.shutdown()


def test_impossible_placement_fails_fast_naming_the_pool(rc):
    rm = ResourceManager(pools(), namespace="t-impossible", probe_s=2.0)
    hog = Cluster(Trainer, resource_manager=rm, num_workers=2, name="hog2")
    try:
        t0 = time.monotonic()
        with pytest.raises(PlacementError) as exc:
            rm.bind("stuck", "actor_train", "H800", fallbacks=[], timeout_s=20)
        assert time.monotonic() - t0 < 20
        assert "'H800'" in str(exc.value) and "0 free of 2" in str(exc.value)
        with pytest.raises(PlacementError) as exc:
            Cluster(Trainer, resource_manager=rm, workers_per_pool={"H20": 1}, demand=5.0,
                    timeout_s=20)
        assert "'H20'" in str(exc.value) and "5 slot(s)" in str(exc.value)
        assert [b.worker for b in read_bindings("t-impossible")] == [w.name for w in hog.workers]
    finally:
        hog.shutdown()


def test_placement_policies_by_name(rc):
    rm = ResourceManager(pools(), policy="spread", namespace="t-spread")
    try:
        # actor_gen candidates are H20 (4 free) then H800 (2 free): spread picks the emptiest
        picks = [rm.bind(f"g{i}", "actor_gen").pool for i in range(4)]
        # free H20/H800: 4/2 -> 3/2 -> 2/2 (tie: candidate order) -> 1/2
        assert picks == ["H20", "H20", "H20", "H800"]
    finally:
        rm.release_all()
    rm = ResourceManager(pools(), policy="pack", namespace="t-pack")
    try:
        picks = [rm.bind(f"g{i}", "actor_gen").pool for i in range(3)]
        assert picks == ["H800", "H800", "H20"]  # fullest pool with room first
    finally:
        rm.release_all()


def test_register_serverless_calls_a_real_http_endpoint(rc):
    with serve_function(score_pure) as ep:
        Reward = make_serverless_worker(ep.url)
        rm = ResourceManager(pools(), namespace="t-serverless")
        rew = Cluster(Reward, resource_manager=rm, num_workers=2)
        try:
            trajs = [["good", "bad"], ["good", "good", "good", "bad"], ["bad"]]
            out = [rew.compute_rewards(t) for t in trajs]
            assert [o["score"] for o in out] == [score_pure(t) for t in trajs]
            assert len({o["pid"] for o in out}) == 2  # 'one' mode alternates workers
            assert rew.compute_async(["good"]) == 1.0
            assert ep.calls == 4
        finally:
            rew.shutdown()
        # url=None: taken from the serverless pool the reward role is bound to
        rm = ResourceManager(pools(serverless_url=ep.url), namespace="t-serverless-pool")
        rew = Cluster(PoolReward, resource_manager=rm, workers_per_pool={"fc": 1})
        try:
            assert rew.workers[0].binding.pool == "fc"
            assert rew.compute_rewards(["good", "good"]) == 1.0
            assert ep.calls == 5
        finally:
            rew.shutdown()


def test_rollart_status_shows_bindings_of_a_running_job(rc):
    rm = ResourceManager(pools(), namespace="t-status")
    env = Cluster(Env, resource_manager=rm, num_workers=2, name="envs")
    try:
        cmd = [sys.executable, "-m", "rollart_sdk.cli", "status", "--address", rc.cluster.address,
               "--namespace", "t-status", "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        st = json.loads(p.stdout)
        assert sorted(b["worker"] for b in st["bindings"]) == ["envs-0", "envs-1"]
        assert {b["pool"] for b in st["bindings"]} == {"cpu"}
        assert st["pools"]["H800"]["total"] == 2
        table = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=120)
        assert table.returncode == 0 and "envs-1" in table.stdout
        # Without an address: every Ray cluster on this machine is asked, on 127.0.0.1.
        environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        found = subprocess.run([sys.executable, "-m", "rollart_sdk.cli", "status",
                                "--namespace", "t-status", "--json"],
                               capture_output=True, text=True, timeout=300, env=environ)
        assert found.returncode == 0, found.stderr
        answers = json.loads(found.stdout)
        answers = answers if isinstance(answers, list) else [answers]  # other users' runs
        assert any(a["address"].startswith("127.0.0.1:")
                   and sorted(b["worker"] for b in a["bindings"]) == ["envs-0", "envs-1"]
                   for a in answers), answers
    finally:
        env.shutdown()


CRASHING_DRIVER = """
import os, sys
from rollart_sdk.ray_utils import init_ray
init_ray(address=sys.argv[1])
from rollart_sdk.resources import ResourceManager
from rollart_sdk.config import PoolConfig
rm = ResourceManager([PoolConfig(name="H20", hardware="H20", profile="bandwidth", count=4)],
                     namespace="t-crash")
rm.bind("orphan", "actor_gen")
print("bound", flush=True)
os._exit(0)  # dies without releasing
"""


def test_records_of_a_crashed_job_are_purged(rc):
    p = subprocess.run([sys.executable, "-c", CRASHING_DRIVER, rc.cluster.address],
                       capture_output=True, text=True, timeout=120)
    assert "bound" in p.stdout, p.stderr[-2000:]
    assert [b.worker for b in read_bindings("t-crash")] == ["orphan"]
    deadline = time.monotonic() + 30
    while read_bindings("t-crash") and time.monotonic() < deadline:
        ResourceManager(pools(), namespace="t-crash")  # purges records of dead jobs
        time.sleep(0.5)
    assert read_bindings("t-crash") == []


def test_removed_pool_falls_back_and_impossible_placement_names_it(rc):
    """Runs last: removes the H800 node from the module's cluster."""
    rc.cluster.remove_node(rc.h800)
    deadline = time.monotonic() + 60
    while ray.cluster_resources().get("pool:H800", 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.cluster_resources().get("pool:H800", 0) == 0
    rm = ResourceManager(pools(), namespace="t-removed")
    train = Cluster(Trainer, resource_manager=rm, num_workers=1)
    try:
        b = train.workers[0].binding
        assert (b.preferred, b.pool, b.fallback) == ("H800", "H20", True)
        assert "0 free" in b.reason
        assert rc.labels[train.where()[0]["node"]] == "H20"
        t0 = time.monotonic()
        with pytest.raises(PlacementError) as exc:
            rm.bind("lonely", "actor_train", fallbacks=[], timeout_s=20)
        assert time.monotonic() - t0 < 20
        assert "no alive node provides resource pool:H800" in str(exc.value)
    finally:
        train.shutdown()

