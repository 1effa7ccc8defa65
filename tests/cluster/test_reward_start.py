"""A reward backend that cannot start says which task and backend, then its own reason."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollart_sdk.cluster.roles import RewardRouter, create_rewards
from rollart_sdk.errors import BackendStartError, ConfigError
from rollart_sdk.plugins import get_registry


def _failing(exc: Exception) -> SimpleNamespace:
    def create(options):
        raise exc

    return SimpleNamespace(name="serverless", create=create)


def test_a_backend_that_cannot_start_names_its_task_and_backend():
    boom = RuntimeError("Serve application 'reward-rule' ... lower deploy.num_cpus")
    with pytest.raises(BackendStartError) as info:
        RewardRouter({"FrozenLake": (_failing(boom), {})})
    msg = str(info.value)
    assert msg.startswith("task 'FrozenLake': reward 'serverless' could not start: "), msg
    assert msg.endswith("RuntimeError: Serve application 'reward-rule' ... lower deploy.num_cpus")
    assert info.value.__cause__ is boom


def test_a_config_error_is_not_rewrapped():
    err = ConfigError([("tasks.0.reward.options.url", "no serverless transport")])
    with pytest.raises(ConfigError) as info:
        create_rewards({"T": (_failing(err), {})})
    assert info.value is err


def test_working_backends_are_built_per_task():
    rule = get_registry().get("reward", "rule")
    built = create_rewards({"A": (rule, rule.validate_options({"mode": "success"})),
                            "B": (rule, rule.validate_options({"mode": "env_return"}))})
    assert sorted(built) == ["A", "B"]
    assert built["A"].options.mode == "success" and built["B"].options.mode == "env_return"
