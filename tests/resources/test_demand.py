"""Placement by real device demand (resources/demand.py): an engine holds its tensor-parallel
size in devices, said by its plugin's options; `rollart validate` checks it against the
pools before anything starts, and the ResourceManager reserves it as one bundle."""

from __future__ import annotations

import sys

import pytest
import ray
from ray import cloudpickle

from rollart_sdk.cluster import ActorGenWorker, Cluster, register
from rollart_sdk.config import RunConfig
from rollart_sdk.config.resolve import resolve_run
from rollart_sdk.errors import ConfigError
from rollart_sdk.plugins import get_plugins
from rollart_sdk.resources import ResourceManager, plan_resources
from rollart_sdk.testing.dists import run_cli

cloudpickle.register_pickle_by_value(sys.modules[__name__])

CONFIG = """\
model:
  tiny: {{hidden_size: 32}}
pools:
  - {{name: gpu, hardware: A100, kind: gpu, count: {count}}}
  - {{name: cpu, hardware: cpu, kind: cpu, count: 8}}
roles:
  actor_train: {{pool: cpu}}
  actor_gen: {{pool: gpu, fallback: []}}
tasks:
  - tag: FrozenLake
    env: {{name: frozenlake}}
engine:
  name: {engine}
  options: {{{options}}}
rollout: {{batch_size: 4, group_size: 2}}
"""


def write(tmp_path, **kw):
    p = tmp_path / "c.yaml"
    p.write_text(CONFIG.format(**kw))
    return p


def resolved_plan(data: dict, registry=None) -> tuple:
    cfg = RunConfig.model_validate(data)
    resolved = resolve_run(cfg, registry or get_plugins().registry)
    return resolved, plan_resources(cfg, resolved)


def test_validate_rejects_a_tp2_engine_on_a_pool_of_one_device(tmp_path):
    bad = run_cli("validate", str(write(tmp_path, count=1, engine="vllm",
                                        options="tensor_parallel_size: 2")))
    assert bad.returncode == 2, bad.stdout + bad.stderr
    err = " ".join(bad.stderr.split())
    # what, where in the config, how to fix
    assert "roles.actor_gen.pool" in err and "one actor_gen worker needs 2 devices" in err, err
    assert "engine.options.tensor_parallel_size=2" in err, err
    assert "pools.0.count=1 (gpu)" in err and "at least 2" in err, err
    ok = run_cli("validate", str(write(tmp_path, count=2, engine="vllm",
                                       options="tensor_parallel_size: 2")))
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_sglang_tp_size_is_its_demand_and_engines_share_a_pool_by_it(tmp_path):
    # Two TP-2 engines need 4 devices: a pool of 3 takes one, not two.
    bad = run_cli("validate", str(write(tmp_path, count=3, engine="sglang",
                                        options="tp_size: 2")),
                  "roles.actor_gen.workers=2")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "2 actor_gen workers of 2 devices each do not fit" in " ".join(bad.stderr.split())


def test_demand_is_the_plugins_and_defaults_to_one():
    base = {"model": {"tiny": {}}, "tasks": [{"tag": "t", "env": {"name": "frozenlake"}}]}
    _, plan = resolved_plan(base)
    assert plan.role("actor_gen").demand == 1 and plan.role("actor_train").demand == 1
    _, plan = resolved_plan({**base, "engine": {"name": "vllm",
                                                "options": {"tensor_parallel_size": 4}}})
    assert plan.role("actor_gen").demand == 4
    assert plan.to_json()["roles"]["actor_gen"]["demand"] == 4


def test_a_megatron_world_must_be_a_multiple_of_tp_times_pp(register_plugin):
    # The plugin's options model, from the checkout, registered without the plugin's
    # `requires` (megatron-core, which the core suite's environment does not have; the
    # options model imports neither it nor torch).
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from rollart_sdk import hookimpl

    root = Path(__file__).resolve().parents[2] / "plugins/trainers/rollart-trainer-megatron"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))

    @hookimpl
    def rollart_register_trainers(registry):
        registry.register("megatron-options",
                          factory="rollart_trainer_megatron.trainer:MegatronTrainer",
                          options="rollart_trainer_megatron.options:MegatronTrainerOptions",
                          summary="test: the megatron plugin's options")

    plugin = SimpleNamespace(rollart_register_trainers=rollart_register_trainers)
    registry = register_plugin(plugin, name="megatron-options", autoload=True).registry
    data = {"model": {"tiny": {}}, "tasks": [{"tag": "t", "env": {"name": "frozenlake"}}],
            "trainer": {"name": "megatron-options", "options": {"tensor_parallel_size": 2,
                                                        "pipeline_parallel_size": 2}},
            "roles": {"actor_train": {"workers": 6}}}
    with pytest.raises(ConfigError) as exc:
        resolved_plan(data, registry)
    (where, msg), = [p for p in exc.value.problems if p[0] == "roles.actor_train.workers"]
    assert "runs 4 workers" in msg and "set it to 8 or 4" in msg, msg
    assert "trainer.options.tensor_parallel_size=2 x trainer.options.pipeline_parallel_size=2" in msg
    data["roles"]["actor_train"]["workers"] = 8
    _, plan = resolved_plan(data, registry)
    assert plan.role("actor_train").demand == 1  # one device per rank


# ----------------------------------------------------------------------- on a Ray cluster


class Gen(ActorGenWorker):
    @register(mode="execute_all")
    def devices(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"gpus": sorted(ctx.get_accelerator_ids()["GPU"]),
                "resources": ctx.get_assigned_resources()}


@pytest.fixture
def fake_gpus():
    """A local Ray node with 4 fake GPUs, serving pool ``gpu`` (4 slots)."""
    from rollart_sdk.ray_utils import init_ray

    if ray.is_initialized():
        ray.shutdown()
    init_ray(num_cpus=2, num_gpus=4, resources={"pool:gpu": 4.0})
    yield
    ray.shutdown()


@pytest.mark.timeout(180)
def test_a_tp2_engine_reserves_one_bundle_of_two_gpus(fake_gpus):
    from ray.util import placement_group_table

    data = {"model": {"tiny": {}}, "tasks": [{"tag": "t", "env": {"name": "frozenlake"}}],
            "pools": [{"name": "gpu", "hardware": "A100", "kind": "gpu", "count": 4},
                      {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 4}],
            "engine": {"name": "vllm", "options": {"tensor_parallel_size": 2}},
            "roles": {"actor_gen": {"workers": 2, "pool": "gpu"},
                      "actor_train": {"pool": "cpu"}, "reward": {"pool": "cpu"}}}
    _, plan = resolved_plan(data)
    gen = plan.role("actor_gen")
    rm = ResourceManager(plan, namespace="demand-test")
    cl = Cluster(Gen, "actor_gen", rm, workers_per_pool=gen.workers_per_pool,
                 demand=gen.demand, name="gen", timeout_s=120)
    try:
        seen = cl.devices()
        assert [len(s["gpus"]) for s in seen] == [2, 2], seen
        assert len({g for s in seen for g in s["gpus"]}) == 4  # no GPU shared
        for s in seen:
            assert s["resources"]["GPU"] == 2.0 and s["resources"]["pool:gpu"] == 2.0, s
        for b in cl.bindings():
            assert b.demand == 2 and b.gpus == 2.0
            table = placement_group_table(_pg(b.pg_id))
            assert list(table["bundles"].values()) == [{"GPU": 2.0, "pool:gpu": 2.0}], table
        # The pool is full: a third TP-2 engine does not fit (two slots would be free
        # with a demand of one per engine).
        assert rm.capacity()["gpu"]["free"] == 0.0
    finally:
        cl.shutdown()


def _pg(pg_id: str):
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(PlacementGroupID.from_hex(pg_id))
