"""The resource plan (pure, no Ray): paper role defaults, task routing, misuse rejected."""

from __future__ import annotations

import pytest

from rollart_sdk.cluster import (
    ActorGenWorker,
    RewardWorker,
    hw_mapping,
    register_serverless,
)
from rollart_sdk.config import RunConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.resources import AffinityPlacement, PackPlacement, SpreadPlacement, plan_resources

PAPER_POOLS = [
    {"name": "H800", "hardware": "H800", "profile": "compute", "count": 8,
     "labels": {"hardware": "H800"}},
    {"name": "H20", "hardware": "H20", "profile": "bandwidth", "count": 24,
     "labels": {"hardware": "H20"}},
    {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 64, "labels": {"zone": "a"}},
    {"name": "fc", "hardware": "serverless", "kind": "serverless", "url": "fc://reward.example"},
]


def config(**over) -> RunConfig:
    data = {
        "model": {"tiny": {}},
        "pools": PAPER_POOLS,
        "tasks": [{"tag": "FrozenLake", "env": {"name": "frozenlake"}, "affinity": "H800"},
                  {"tag": "GEM-math", "env": {"name": "arithmetic"}}],
        "roles": {"actor_gen": {"workers": 4}},
    }
    data.update(over)
    return RunConfig.model_validate(data)


def test_paper_role_defaults_and_task_pools():
    plan = plan_resources(config())
    assert {r: plan.role(r).preferred for r in plan.roles} == {
        "actor_train": "H800", "actor_gen": "H20", "environment": "cpu", "reward": "H800"}
    assert plan.role("actor_train").fallbacks == ["H20"]
    assert plan.role("actor_gen").fallbacks == ["H800"]
    assert plan.role("environment").fallbacks == []
    assert plan.task_pools == {"FrozenLake": "H800", "GEM-math": "H20"}
    assert plan.hw_affinity() == {"FrozenLake": "H800", "GEM-math": "H20", "default": "H20"}
    # generation workers are spread over every pool a task needs
    assert plan.role("actor_gen").workers_per_pool == {"H20": 2, "H800": 2}
    assert plan.warnings == []


def test_pd_prefill_workers_follow_task_affinity():
    """Prefill-decode disaggregation: decode workers in the decode pool, prefill workers
    spread over the prefill pool and each pool a task's affinity names (a task's prompts
    are computed in its own pool); too few of them is a warning naming the tasks."""
    pd = {"actor_gen": {"prefill": {"workers": 2}, "decode": {"pool": "H20", "workers": 3}}}
    plan = plan_resources(config(roles=pd))
    gen = plan.role("actor_gen")
    assert gen.workers_per_pool == {"H20": 3}
    assert gen.prefill_per_pool == {"H20": 1, "H800": 1}
    assert plan.prefill_pools == {"FrozenLake": "H800", "GEM-math": "H20"}
    assert plan.prefill_affinity() == {"FrozenLake": "H800", "GEM-math": "H20", "default": "H20"}
    assert plan.warnings == [] and plan.to_json()["prefill_pools"] == plan.prefill_pools
    pd["actor_gen"]["prefill"] = {"workers": 1, "pool": "H20"}
    plan = plan_resources(config(roles=pd))
    assert plan.role("actor_gen").prefill_per_pool == {"H20": 1}
    assert any("FrozenLake" in w and "prefill.workers" in w for w in plan.warnings)


def test_config_overrides_role_pools_and_fallbacks():
    plan = plan_resources(config(roles={"actor_gen": {"pool": "H20", "fallback": ["cpu"]},
                                        "reward": {"pool": "fc"}}))
    assert plan.role("actor_gen").candidates == ["H20", "cpu"]
    assert plan.role("reward").preferred == "fc"
    # one generation worker cannot cover two pools: a warning, the tag falls back
    assert plan.role("actor_gen").workers_per_pool == {"H20": 1}
    assert any("FrozenLake" in w for w in plan.warnings)


def test_default_local_pool_hosts_every_role():
    cfg = RunConfig.model_validate({"model": {"tiny": {}},
                                    "tasks": [{"tag": "t", "env": {"name": "x"}}]})
    plan = plan_resources(cfg)
    assert {r.preferred for r in plan.roles.values()} == {"local"}
    res, labels = plan.local_node_resources()
    assert res == {"pool:local": 64.0} and labels == {}


def test_local_node_resources_make_one_machine_every_pool():
    res, labels = plan_resources(config()).local_node_resources()
    assert res == {"pool:H800": 8.0, "pool:H20": 24.0, "pool:cpu": 64.0, "pool:fc": 1.0}
    assert labels == {"zone": "a"}  # 'hardware' clashes between pools, so it is left out


@pytest.mark.parametrize(
    ("over", "where", "words"),
    [
        ({"roles": {"actor_train": {"pool": "fc"}}}, "roles.actor_train.pool", "serverless"),
        ({"tasks": [{"tag": "A", "env": {"name": "x"}, "affinity": "fc"}]}, "tasks.0.affinity",
         "serverless"),
        ({"roles": {"actor_gen": {"workers": 40}}}, "roles.actor_gen.workers", "do not fit"),
        ({"pools": [*PAPER_POOLS[:3], {"name": "s3", "hardware": "x", "kind": "serverless",
                                       "url": "gopher://a"}]}, "pools.3.url", "'gopher'"),
    ],
)
def test_misuse_is_a_config_error_naming_the_key(over, where, words):
    with pytest.raises(ConfigError) as exc:
        plan_resources(config(**over))
    assert any(w == where and words in m for w, m in exc.value.problems), exc.value.problems


def test_decorator_misuse_rejected_at_validation(monkeypatch, register_plugin):
    class BadGen(ActorGenWorker):
        @hw_mapping(hw_affinity={"FrozenLake": "A100", "default": "H20"})
        def generate(self, ids, tag_name="default"):
            return ids

    class BadReward(RewardWorker):
        @register_serverless(attribute="proxy", serverless_url="lambda://fn")
        def score(self, traj):
            return self.proxy(traj)

    with pytest.raises(ConfigError) as exc:
        plan_resources(config(), workers={"actor_gen": BadGen, "reward": BadReward})
    text = str(exc.value)
    assert "'A100' is provided by no pool" in text and "roles.actor_gen.generate" in text
    assert "scheme 'lambda'" in text and "roles.reward.score" in text
    # a scheme added by a plugin (hook rollart_register_serverless_schemes) is accepted
    import rollart_sdk.plugins as plugins_mod

    def schemes(registry):
        registry.register("lambda", factory=lambda url, timeout: (lambda *a: None))

    with_lambda = register_plugin({"rollart_register_serverless_schemes": schemes}, name="lambda")
    monkeypatch.setattr(plugins_mod, "_DEFAULT", with_lambda)
    with pytest.raises(ConfigError) as exc:
        plan_resources(config(), workers={"reward": BadReward, "actor_gen": BadGen})
    assert "lambda" not in str(exc.value)


def test_policies_choose_and_explain():
    free = {"H800": 0.0, "H20": 3.0, "cpu": 1.0}
    pool, why = AffinityPlacement().choose("actor_train", "H800", ["H800", "H20"], free, 1.0)
    assert pool == "H20" and "fell back" in why and "H800" in why
    pool, why = AffinityPlacement().choose("actor_train", "H20", ["H20", "H800"], free, 1.0)
    assert pool == "H20" and "preferred" in why
    assert PackPlacement().choose("env", "H20", ["H20", "cpu"], free, 1.0)[0] == "cpu"
    assert SpreadPlacement().choose("env", "cpu", ["cpu", "H20"], free, 1.0)[0] == "H20"
    for policy in (AffinityPlacement(), PackPlacement(), SpreadPlacement()):
        pool, why = policy.choose("actor_train", "H800", ["H800", "cpu"], free, 2.0)
        assert pool is None and "H800" in why


def _resolved_rewards(**resources_by_tag):
    """A ResolvedRun stand-in carrying only what the plan reads: each task's reward
    descriptor (its declared resources)."""
    from types import SimpleNamespace

    from rollart_sdk.registry import Descriptor

    rewards = {tag: SimpleNamespace(descriptor=Descriptor("reward", f"r-{tag}", "m:f", None, "",
                                                          "p", resources=res), options=None)
               for tag, res in resources_by_tag.items()}
    return SimpleNamespace(rewards=rewards)


def test_reward_role_takes_a_slot_only_for_a_backend_that_asks():
    # rule / serverless rewards declare nothing: no reward worker, no GPU slot pinned
    plan = plan_resources(config(), _resolved_rewards(FrozenLake={}, **{"GEM-math": {}}))
    assert plan.role("reward").workers == 0 and plan.role("reward").workers_per_pool == {}
    # a judge model declares a GPU: one worker on a GPU pool (compute first, the paper's default)
    plan = plan_resources(config(), _resolved_rewards(FrozenLake={}, **{"GEM-math": {"GPU": 1}}))
    assert plan.role("reward").workers_per_pool == {"H800": 1}
    # a backend asking only for CPUs goes to the CPU pool
    plan = plan_resources(config(), _resolved_rewards(FrozenLake={"CPU": 2}))
    assert plan.role("reward").workers_per_pool == {"cpu": 1}
    # without the resolved backends (older callers) the plan keeps one reward worker
    assert plan_resources(config()).role("reward").workers == 1
