"""The same pool config on one machine (the embedded default): every pool becomes a custom
resource of the local node, roles bind to their paper defaults, misuse fails before start."""

from __future__ import annotations

import sys

import pytest
import ray
from ray import cloudpickle

from rollart_sdk.cluster import ActorGenWorker, ActorTrainWorker, Cluster, hw_mapping, register
from rollart_sdk.config import RunConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.ray_utils import init_ray
from rollart_sdk.resources import ResourceManager, plan_resources, read_bindings

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Train(ActorTrainWorker):
    @register(mode="execute_all")
    def pool(self) -> str:
        return self.binding["pool"]


class WrongGen(ActorGenWorker):
    @hw_mapping(hw_affinity={"FrozenLake": "B200", "default": "H20"})
    def generate(self, ids: list[int], tag_name: str = "default") -> list[int]:
        return ids


@pytest.fixture(scope="module")
def plan():
    cfg = RunConfig.model_validate({
        "model": {"tiny": {}},
        "pools": [
            {"name": "H800", "hardware": "H800", "profile": "compute", "count": 2,
             "labels": {"hardware": "H800"}},
            {"name": "H20", "hardware": "H20", "profile": "bandwidth", "count": 2,
             "labels": {"hardware": "H20"}},
            {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 4},
        ],
        "tasks": [{"tag": "FrozenLake", "env": {"name": "x"}, "affinity": "H800"}],
    })
    plan = plan_resources(cfg)
    resources, labels = plan.local_node_resources()
    init_ray(num_cpus=1, resources=resources, labels=labels)
    yield plan
    ray.shutdown()


def test_roles_bind_to_their_pools_on_one_node(plan):
    rm = ResourceManager(plan, namespace="embedded")
    try:
        got = {role: rm.bind(f"w-{role}", role) for role in plan.roles}
        assert {r: b.pool for r, b in got.items()} == {
            "actor_train": "H800", "actor_gen": "H20", "environment": "cpu", "reward": "H800"}
        assert len({b.node_id for b in got.values()}) == 1
        assert not any(b.fallback for b in got.values())
        # H800 now holds 2 (train + reward): the next trainer falls back to H20
        extra = rm.bind("w-extra", "actor_train")
        assert (extra.pool, extra.fallback) == ("H20", True)
        assert len(read_bindings("embedded")) == 5
    finally:
        rm.release_all()
    assert read_bindings("embedded") == []


def test_cluster_runs_on_the_local_node(plan):
    rm = ResourceManager(plan, namespace="embedded-cluster")
    c = Cluster(Train, resource_manager=rm, num_workers=2)
    try:
        assert c.pool() == ["H800", "H800"]
    finally:
        c.shutdown()


def test_cluster_rejects_decorator_misuse_before_starting(plan):
    rm = ResourceManager(plan, namespace="embedded-bad")
    with pytest.raises(ConfigError, match="'B200' is provided by no pool"):
        Cluster(WrongGen, resource_manager=rm, num_workers=1)
    assert read_bindings("embedded-bad") == []
