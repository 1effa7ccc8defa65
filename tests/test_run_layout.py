"""``layout: auto | inprocess | ray`` (rollart_sdk/layout.py): which layout a run gets and
the reason given, rule by rule, against the installed plugins' registrations."""

from __future__ import annotations

import copy

import pytest

from rollart_sdk.config import load_config
from rollart_sdk.errors import ConfigError
from rollart_sdk.layout import choose_layout, inprocess_config

BASE = {
    "name": "layout",
    "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                       "intermediate_size": 64}},
    "tasks": [{"tag": "FrozenLake", "env": {"name": "frozenlake"},
               "reward": {"name": "rule", "options": {"mode": "success"}}}],
}


def cfg(overrides=(), **changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return load_config(data=data, overrides=list(overrides))[0]


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_auto_runs_a_one_machine_config_in_process():
    layout = choose_layout(cfg())
    assert (layout.name, layout.asked) == ("inprocess", "auto")
    assert layout.line() == ("layout: inprocess (auto: one machine, every worker can share "
                             "this process)")
    assert layout.to_json() == {"layout": "inprocess", "asked": "auto",
                                "why": "one machine, every worker can share this process"}


@pytest.mark.parametrize(("overrides", "changes", "why"), [
    (["ray.address=10.0.0.1:6379"], {}, "a Ray address is given (10.0.0.1:6379)"),
    ([], {"pools": [{"name": "g", "hardware": "H800", "labels": {"zone": "a"}}]},
     "pool 'g' selects Ray nodes by labels"),
    (["engine.name=vllm"], {}, "engine 'vllm' runs in processes of its own"),
    (["trainer.name=megatron"], {}, "trainer 'megatron' runs in processes of its own"),
    (["roles.actor_train.workers=2"], {},
     "the trainer has 2 data-parallel ranks, each a process of its own"),
    (["transport.name=nccl"], {}, "transport 'nccl' moves weights between processes"),
    (["tasks.0.reward.name=judge"], {},
     "reward 'judge' (tasks.0) declares resources for a worker of its own"),
])
def test_auto_picks_ray_when_the_run_needs_processes_and_says_why(overrides, changes, why):
    layout = choose_layout(cfg(overrides, **changes))
    assert (layout.name, layout.asked, layout.why) == ("ray", "auto", why)
    assert layout.line() == f"layout: ray (auto: {why})"


def test_the_ray_address_of_the_environment_counts(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # what `--address` sets
    assert choose_layout(cfg()).why == "a Ray address is given (127.0.0.1:6379)"


def test_an_explicit_layout_overrides_auto():
    assert choose_layout(cfg(["layout=ray"])).line() == "layout: ray (set in the config)"
    # a judge model in this process, if the user says so
    layout = choose_layout(cfg(["layout=inprocess", "tasks.0.reward.name=judge"]))
    assert (layout.name, layout.asked) == ("inprocess", "inprocess")


@pytest.mark.parametrize(("override", "why"), [
    ("roles.actor_train.workers=2", "the trainer has 2 data-parallel ranks"),
    ("transport.name=nccl", "transport 'nccl' moves weights between processes"),
])
def test_inprocess_refuses_what_cannot_share_one_process(override, why):
    with pytest.raises(ConfigError) as err:
        choose_layout(cfg(["layout=inprocess", override]))
    assert err.value.problems[0][0] == "layout"
    assert why in err.value.problems[0][1] and "use layout: ray" in err.value.problems[0][1]


def test_a_bad_layout_value_is_refused_with_the_choices():
    with pytest.raises(ConfigError) as err:
        cfg(["layout=local"])
    assert "layout" in str(err.value) and "inprocess" in str(err.value)


def test_inprocess_moves_weights_with_the_local_transport_and_keeps_the_config():
    c = cfg()
    assert c.transport.name == "ray"
    assert inprocess_config(c).transport.name == "local"
    assert c.transport.name == "ray"  # the config (config.yaml, --resume checks) unchanged
    other = cfg(["transport.name=local"])
    assert inprocess_config(other) is other
