"""Decorators annotate methods; misuse is caught at declaration or validation (no Ray)."""

from __future__ import annotations

import pytest

from rollart_sdk.cluster import (
    ActorGenWorker,
    RewardWorker,
    Worker,
    check_worker_class,
    dispatch_specs,
    hw_mapping,
    register,
    register_serverless,
    serve_function,
)
from rollart_sdk.cluster.serverless import ServerlessError, ServerlessProxy
from rollart_sdk.config import PoolConfig
from rollart_sdk.errors import ConfigError

POOLS = [PoolConfig(name="gpu-a", hardware="H800", count=2),
         PoolConfig(name="gpu-b", hardware="H20", profile="bandwidth", count=2)]


class Base(Worker):
    @register(mode="execute_all")
    def step(self) -> int:
        return 1

    @register(mode="one")
    def once(self) -> int:
        return 1


class Child(Base):
    def step(self) -> int:  # overridden without a decorator: no longer dispatched
        return 2

    @hw_mapping(hw_affinity={"FrozenLake": "H800", "default": "gpu-b"})
    def generate(self, ids: list[int], tag_name: str = "default") -> list[int]:
        return ids


def test_specs_follow_inheritance_and_overrides():
    specs = dispatch_specs(Child)
    assert set(specs) == {"once", "generate"}
    assert specs["generate"].hw_affinity["FrozenLake"] == "H800"
    check_worker_class(Child, POOLS)  # hardware class or pool name both accepted


def test_bad_declarations_fail_at_once():
    with pytest.raises(ValueError, match="unknown dispatch mode"):
        register(mode="everywhere")
    with pytest.raises(ValueError, match="mapping"):
        hw_mapping(hw_affinity=["H800"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="already carries"):
        register()(register(mode="one")(lambda self: None))


def test_validation_names_the_method_and_the_fix():
    class Gen(ActorGenWorker):
        @hw_mapping(hw_affinity={"default": "TPU"})
        def generate(self, ids, tag_name="default"):
            return ids

    class Rew(RewardWorker):
        @register_serverless(attribute="proxy")
        def score(self, traj):
            return self.proxy(traj)

    with pytest.raises(ConfigError, match=r"Gen.generate @hw_mapping\['default'\].*'TPU'"):
        check_worker_class(Gen, POOLS)
    with pytest.raises(ConfigError, match="no serverless pool declared"):
        check_worker_class(Rew, POOLS)


def test_http_proxy_round_trip_and_errors():
    def fn(a: int, b: int = 0) -> int:
        if a < 0:
            raise ValueError("negative")
        return a + b

    with serve_function(fn) as ep:
        proxy = ServerlessProxy(ep.url, timeout_s=10)
        assert proxy(2, b=3) == 5
        with pytest.raises(ServerlessError, match="negative"):
            proxy(-1)
        with pytest.raises(ServerlessError, match="JSON-serialisable"):
            proxy(object())
    with pytest.raises(ServerlessError, match="unreachable"):
        ServerlessProxy(ep.url, timeout_s=2)(1)
