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
from rollart_sdk.config import PoolConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.serverless import ServerlessError, ServerlessProxy

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
        with pytest.raises(ServerlessError, match="HTTP 500.*error id") as err:
            proxy(-1)
        assert "negative" not in str(err.value)  # the exception text stays on the server
        with pytest.raises(ServerlessError, match="JSON-serialisable"):
            proxy(object())
    with pytest.raises(ServerlessError, match="unreachable"):
        ServerlessProxy(ep.url, timeout_s=2)(1)


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_endpoint_with_a_token_refuses_callers_without_it():
    with serve_function(lambda x: x * 2, token="s3cret") as ep:
        body = b'{"args": [21]}'
        json_ct = {"Content-Type": "application/json"}
        assert _post(ep.url, body, json_ct)[0] == 401
        assert _post(ep.url, body, {**json_ct, "Authorization": "Bearer wrong"})[0] == 401
        assert _post(ep.url, body, {**json_ct, "Authorization": "Bearer s3cret"}) == (200, {"result": 42})
        assert ServerlessProxy(ep.url, 10, headers={"Authorization": "Bearer s3cret"})(4) == 8
        with pytest.raises(ServerlessError, match="HTTP 401"):
            ServerlessProxy(ep.url, 10)(4)
        assert ep.calls == 2 and ep.rejected == 3


def test_endpoint_accepts_json_only_and_bounds_the_body():
    with serve_function(lambda x: x) as ep:
        assert _post(ep.url, b'{"args": [1]}', {"Content-Type": "text/plain"})[0] == 415
        # a declared length over the limit is refused before the body is read
        too_long = {"Content-Type": "application/json", "Content-Length": str((1 << 20) + 1)}
        assert _post(ep.url, b'{"args": [1]}', too_long)[0] == 413
        assert _post(ep.url, b"[1, 2]", {"Content-Type": "application/json"})[0] == 400
        assert ep.calls == 0 and ep.rejected == 3
