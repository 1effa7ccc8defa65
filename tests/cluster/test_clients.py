"""The typed boundary between the control plane and the workers (cluster/hosts.py,
cluster/handles.py): every worker implements its role's Protocol, every client calls the
method of its own name, and the control plane names no worker method as a string."""

from __future__ import annotations

import ast
import asyncio
import inspect
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from rollart_sdk.cluster.envs import EnvCallError, EnvHung, EnvWorker, InlineEnvWorker
from rollart_sdk.cluster.envs.thread import ThreadEnvWorker
from rollart_sdk.cluster.envs.virtual import VirtualEnvHost
from rollart_sdk.cluster.handles import (
    EngineClient,
    EnvClient,
    RewardClient,
    TrainerClient,
    WorkerHandle,
    await_answer,
)
from rollart_sdk.cluster.hosts import EngineHost, EnvHost, RewardHost, TrainerHost
from rollart_sdk.cluster.roles import (
    EngineWorker,
    RewardBackendWorker,
    RewardRouter,
    TrainerWorker,
)

ROOT = Path(__file__).resolve().parents[2] / "rollart_sdk"
# Where the driver calls workers (the control plane; the composition root building the
# job, its summary and final save; the commands): no method name passed as a string here.
SCANNED = [*sorted((ROOT / "control").rglob("*.py")), ROOT / "weights" / "sync.py",
           ROOT / "evaluate.py", *sorted((ROOT / "job").rglob("*.py")),
           *sorted((ROOT / "cli").rglob("*.py"))]
# Not a worker call: env_probe closes the env *plugin* it built in the driver to check it.
NOT_WORKER_CALLS = {("rollart_sdk/job/env_probe.py", "getattr(env, 'close', None)")}
PAIRS = [(EngineHost, EngineClient), (TrainerHost, TrainerClient), (EnvHost, EnvClient),
         (RewardHost, RewardClient)]
IMPLEMENTATIONS = [(EngineHost, EngineWorker), (TrainerHost, TrainerWorker),
                   (EnvHost, EnvWorker), (EnvHost, InlineEnvWorker), (EnvHost, ThreadEnvWorker),
                   (EnvHost, VirtualEnvHost),
                   (RewardHost, RewardBackendWorker), (RewardHost, RewardRouter)]
STREAMED = {"generate_many"}  # methods whose results come as they are yielded


def members(protocol: type) -> set[str]:
    return {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}


def host_methods() -> set[str]:
    return set().union(*(members(p) for p, _ in PAIRS))


def string_calls(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """``(line, code)`` of every call that dispatches on a worker method's name: a handle's
    ``call``/``submit`` or a Ray actor's ``remote`` (every worker call passes through one
    of them, so a helper that forwards a method name is caught where it forwards it), and
    ``getattr(x, "<host method>")``."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Attribute) and fn.attr in ("call", "submit", "remote"):
            out.append((node.lineno, ast.unparse(node)))
        elif (isinstance(fn, ast.Name) and fn.id == "getattr" and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            out.append((node.lineno, ast.unparse(node)))
    return sorted(out)


def test_the_scan_finds_string_method_names() -> None:
    src = ('async def f(h, w, a):\n    await h.call("generate", r)\n    w.submit("prefill_kv", r)\n'
           '    await a.suspend.remote()\n    getattr(w, "stage_weights")(m)\n'
           '    getattr(w, "name")\n    d.get("version")\n    await h.engine.generate(r)\n')
    found = [code for _, code in string_calls(ast.parse(src), host_methods())]
    assert found == ["h.call('generate', r)", "w.submit('prefill_kv', r)",
                     "a.suspend.remote()", "getattr(w, 'stage_weights')"]


def test_the_control_plane_passes_no_worker_method_as_a_string() -> None:
    names = host_methods()
    found = [f"{path.relative_to(ROOT.parent)}:{line}: {code}"
             for path in SCANNED for line, code in string_calls(ast.parse(path.read_text()), names)
             if (str(path.relative_to(ROOT.parent)), code) not in NOT_WORKER_CALLS]
    assert not found, ("call the workers through the typed clients (rollart_sdk/cluster/"
                       "clients.py: handle.engine.generate(...)), not by method name:\n"
                       + "\n".join(found))


@pytest.mark.parametrize(("protocol", "client"), PAIRS, ids=lambda x: x.__name__)
def test_each_client_is_its_protocol_and_calls_the_method_of_its_name(
        protocol: type, client: type) -> None:
    assert members(protocol) <= set(dir(client)), members(protocol) - set(dir(client))
    calls: list[str] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            if name in STREAMED:
                async def stream(*args: Any) -> Any:
                    calls.append(name)
                    yield []
                return stream

            async def method(*args: Any) -> Any:
                calls.append(name)
                return 0 if name in ("version", "reload") else None
            return method

    async def drain(it: Any) -> None:
        async for _ in it:
            pass

    c = client(WorkerHandle("w", Recorder(), is_ray=False))
    for name in sorted(members(protocol)):
        params = [p for p in inspect.signature(getattr(c, name)).parameters.values()
                  if p.default is inspect.Parameter.empty]
        out = getattr(c, name)(*([None] * len(params)))
        asyncio.run(drain(out) if name in STREAMED else out)
        assert calls[-1] == name, f"{client.__name__}.{name} calls {calls[-1]!r}"


@pytest.mark.parametrize(("protocol", "worker"), IMPLEMENTATIONS,
                         ids=lambda x: x.__name__)
def test_each_worker_implements_its_role_protocol(protocol: type, worker: type) -> None:
    """By name and arity here (mypy checks the types: ``_conforms`` in each module)."""
    for name in members(protocol):
        want = inspect.signature(getattr(protocol, name))
        have = inspect.signature(getattr(worker, name))
        assert list(have.parameters) == list(want.parameters), (worker.__name__, name)


def test_the_handle_gives_each_role_its_client() -> None:
    h = WorkerHandle("gen-0", object(), is_ray=False)
    assert (type(h.engine), type(h.trainer), type(h.env), type(h.reward)) == (
        EngineClient, TrainerClient, EnvClient, RewardClient)
    assert h.engine.name == "gen-0" and h.engine.handle is h
    import rollart_sdk.cluster.clients as old_path

    # The old import path names the same classes (one release, CHANGELOG.md).
    assert (old_path.EngineClient, old_path.await_answer) == (EngineClient, await_answer)


def test_await_answer_runs_one_client_call_from_outside_the_loop() -> None:
    class Trainer:
        def version(self) -> int:
            return 7

    assert await_answer(WorkerHandle("train-0", Trainer(), is_ray=False).trainer.version(),
                        5) == 7


def test_env_hosts_share_one_set_of_errors() -> None:
    import rollart_sdk.cluster.env_host as old_process
    import rollart_sdk.cluster.inline_env as old_inline

    # The old import paths name the same classes (one release, CHANGELOG.md).
    assert old_process.EnvHung is EnvHung is old_inline.InlineEnvHung
    # The simulator's (virtual-time) host raises the same one.
    assert vars(sys.modules[VirtualEnvHost.__module__])["EnvHung"] is EnvHung
    assert old_inline.InlineEnvCallError is EnvCallError is old_process.EnvCallError
    # A thread host's hung call keeps saying that its thread runs on, across processes too.
    hung = pickle.loads(pickle.dumps(EnvHung("no step within 1s", killed=False)))
    assert isinstance(hung, TimeoutError) and hung.killed is False
    assert str(hung) == "no step within 1s" and EnvHung("x").killed is True
