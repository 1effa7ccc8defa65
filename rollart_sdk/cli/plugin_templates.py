"""The files ``rollart new-plugin`` writes, one working backend per kind.

Placeholders (``{name}``, ``{package}``, ``{cls}``, ``{options}``, ``{kind}``, ``{dist}``,
``{hook}``, ``{module}``) are replaced by plain text substitution; nothing else in these
texts uses braces that way. The engine and trainer templates (the kinds that run a model)
are in ``plugin_templates_model``.
"""

from __future__ import annotations

from rollart_sdk.cli.plugin_templates_model import ENGINE, ENGINE_TEST, TRAINER, TRAINER_TEST

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "rollart {kind} plugin: {name}"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["rollart-sdk>=0.1", "pydantic>=2.6,<3", "gymnasium>=1.0"{deps}]

[project.optional-dependencies]
test = ["pytest>=8"]

[project.entry-points.rollart]
{dist} = "{package}.plugin"

[tool.setuptools.packages.find]
include = ["{package}*"]

[tool.setuptools.package-data]
{package} = ["py.typed"]
"""

README = """\
# {dist}

A rollart plugin that registers the {kind} `{name}` (written by `rollart new-plugin`).

## How it works

{how}

## Use it

```bash
pip install -e .
rollart plugins --kind {kind}          # listed, status ok
rollart plugins --options {kind}:{name}  # its options
```

## Options

`rollart plugins --options {kind}:{name}` prints the options model
(`{package}.{module}:{options}`) with each key's type, default and description.

## Tests

```bash
pytest
```

`tests/test_{name}.py` runs rollart's conformance kit for the kind and checks the
registration (the `register_plugin` fixture comes with rollart-sdk's pytest plugin).
"""

PLUGIN = """\
\"\"\"Registers {kind} ``{name}``. Imports nothing heavy: the backend loads when selected.\"\"\"

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def {hook}(registry: Registrar) -> None:
    registry.register(
        "{name}",
        factory="{package}.{module}:{cls}",
        options="{package}.{module}:{options}",
        summary="{kind} {name} (rollart new-plugin template)",{extra}
    )
"""

ENV = """\
\"\"\"Environment ``{name}``: a text environment (gymnasium API, str observations and actions).

Replace the echo game with yours; ``tests/test_{name}.py`` runs rollart's conformance kit
(``check_env``) on it. Never raise on a bad reply: answer it and set
``info["invalid_action"]``. An exception in ``step`` during a run ends that trajectory; it
is dropped and counted with the reason.
\"\"\"

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon")


class {options}(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt option is an error, not ignored

    # Not "max_turns": that is the task key (tasks[].max_turns) capping turns for every env;
    # this is the env's own limit. Set the task's max_turns at least as high.
    max_replies: int = Field(3, ge=1, description="replies before the episode is truncated")


class {cls}(gymnasium.Env):
    \"\"\"Echo: the env shows a word; repeating it ends the episode with reward 1.\"\"\"

    system_prompt = "Repeat the word you are shown, exactly."
    action_vocabulary = None  # free text: any reply is allowed

    def __init__(self, **options: Any) -> None:
        self.options = {options}(**options)
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Text(max_length=200, charset=string.printable)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)  # seeds self.np_random: same seed, same word
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        self.turns = 0
        return "Repeat: " + self.word, {}

    def step(self, action: str):
        self.turns += 1
        reply = action.strip().lower() if isinstance(action, str) else ""
        success = reply == self.word
        truncated = not success and self.turns >= self.options.max_replies
        info = {"success": success, "invalid_action": not reply}
        obs = "Correct!" if success else "No. Repeat: " + self.word
        return obs, 1.0 if success else 0.0, success, truncated, info
"""

ENV_TEST = """\
import {package}.plugin as plugin
from {package}.{module} import {cls}

from rollart_sdk.testing.env import check_env


def test_conforms():
    check_env({cls}, seed=0)


def test_repeating_the_word_succeeds():
    env = {cls}()
    obs, _ = env.reset(seed=1)
    word = obs.split(": ", 1)[1]
    _, reward, terminated, _, info = env.step(word)
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_registers(register_plugin):
    env = register_plugin(plugin).registry.get("env", "{name}").create({"max_replies": 2})
    assert env.options.max_replies == 2
"""

REWARD = """\
\"\"\"Reward ``{name}``: scores one finished trajectory (``async score``).

Replace the scoring rule with yours; ``tests/test_{name}.py`` runs rollart's conformance
kit (``check_reward``). ``score`` may call remote services: it is awaited, concurrently.
\"\"\"

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import RewardRequest, RewardResult


class {options}(BaseModel):
    model_config = ConfigDict(extra="forbid")

    success_bonus: float = Field(1.0, description="added when info['success'] is true")
    use_env_return: bool = Field(True, description="start from the environment's return")


class {cls}:
    def __init__(self, success_bonus: float = 1.0, use_env_return: bool = True) -> None:
        self.success_bonus = success_bonus
        self.use_env_return = use_env_return

    async def score(self, request: RewardRequest) -> RewardResult:
        reward = float(request.env_return) if self.use_env_return else 0.0
        success = bool(request.info.get("success"))
        if success:
            reward += self.success_bonus
        return RewardResult(request.trajectory_id, reward, {"success": success})
"""

REWARD_TEST = """\
import {package}.plugin as plugin
from {package}.{module} import {cls}

from rollart_sdk.testing.reward import check_reward, make_request


def test_conforms():
    check_reward({cls}(), [
        (make_request(env_return=1.0, info={"success": True}, trajectory_id="a"), 2.0),
        (make_request(env_return=0.0, info={"success": False}, trajectory_id="b"), 0.0),
    ])


def test_registers(register_plugin):
    backend = register_plugin(plugin).registry.get("reward", "{name}").create(
        {"use_env_return": False})
    check_reward(backend, [(make_request(env_return=1.0, info={"success": True}), 1.0)])
"""

TRANSPORT = """\
\"\"\"Weight transport ``{name}``: moves a policy version's buckets from the trainer to
every engine worker.

This template keeps buckets in a process-wide dict, so it works only when the trainer and
the engines share one process (it registers with ``process_local=True``, and ``rollart
validate`` refuses it for a Ray run): replace ``_STORE`` with a channel between processes
(a store, a collective, RDMA) and drop that flag. ``tests/test_{name}.py`` runs rollart's
conformance kit (``check_transport``).
\"\"\"

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import BucketRef, WeightBucket, WeightManifest
from rollart_sdk.weights import WeightSyncError, verify

_STORE: dict[tuple[str, int], list[WeightBucket]] = {}
_LOCK = threading.Lock()


class {options}(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel: str = Field("default", description="name shared by the sender and its receivers")
    keep_versions: int = Field(3, ge=1, description="published versions kept before release "
                               "(3: served, being received, just published; a restarted "
                               "engine reloads the served one)")


class {cls}:
    style: ClassVar[Literal["push", "pull"]] = "pull"

    def __init__(self, role: str = "sender", channel: str = "default",
                 keep_versions: int = 3) -> None:
        self.role = role
        self.channel = channel
        self.keep_versions = keep_versions
        self._published: list[int] = []

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        stored = list(buckets)
        with _LOCK:
            _STORE[(self.channel, version)] = stored
            self._published.append(version)
            for old in self._published[: -self.keep_versions]:
                _STORE.pop((self.channel, old), None)
            self._published = self._published[-self.keep_versions:]
        refs = [BucketRef(b.index, sorted(b.tensors), b.nbytes, b.checksum, handle=b.index)
                for b in stored]
        return WeightManifest(version, "{name}", refs, meta={"channel": self.channel})

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        with _LOCK:
            stored = _STORE.get((manifest.meta.get("channel", self.channel), manifest.version))
        if stored is None:
            raise WeightSyncError(manifest.version, "not published, or already released")
        for ref in manifest.buckets:
            bucket = stored[ref.handle]
            verify(bucket, ref, manifest.version)  # a corrupt bucket raises, never loads
            yield bucket

    def release(self, version: int) -> None:
        with _LOCK:
            _STORE.pop((self.channel, version), None)

    def close(self) -> None:
        pass
"""

TRANSPORT_TEST = """\
import {package}.plugin as plugin
from {package}.{module} import {cls}

from rollart_sdk.testing.transport import check_transport


def test_conforms():
    summary = check_transport(lambda: {cls}(role="sender", channel="kit"),
                              lambda: {cls}(role="receiver", channel="kit"), name="{name}")
    assert summary["corrupt_rejected"]


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("transport", "{name}")
    assert desc.create({"channel": "x"}, role="sender").channel == "x"
"""

PLACEMENT = """\
\"\"\"Placement policy ``{name}``: picks a pool for each worker and says why.

The ResourceManager calls ``choose`` with the role, its preferred pool, the compatible
pools (in fallback order), their free capacity and the worker's demand; the reason is
stored in the binding record ``rollart status`` shows.
\"\"\"

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class {options}(BaseModel):
    model_config = ConfigDict(extra="forbid")

    headroom: float = Field(0.0, ge=0.0, description="free slots a pool must keep after placing")


class {cls}:
    \"\"\"The preferred pool when it keeps ``headroom`` free slots, else the compatible pool
    with the most free capacity.\"\"\"

    def __init__(self, headroom: float = 0.0) -> None:
        self.headroom = headroom

    def choose(self, role: str, preferred: str, candidates: list[str],
               free: dict[str, float], demand: float) -> tuple[str | None, str]:
        need = demand + self.headroom
        if free.get(preferred, 0.0) >= need:
            return preferred, f"preferred pool {preferred} keeps {self.headroom:g} free"
        fits = [p for p in candidates if free.get(p, 0.0) >= need]
        if not fits:
            return None, f"no compatible pool has {need:g} free slot(s) for {role}"
        best = max(fits, key=lambda p: free.get(p, 0.0))
        return best, f"{preferred} is short; {best} has the most room"
"""

PLACEMENT_TEST = """\
import {package}.plugin as plugin
from {package}.{module} import {cls}


def test_prefers_then_falls_back_with_a_reason():
    policy = {cls}(headroom=1.0)
    assert policy.choose("reward", "a", ["a", "b"], {"a": 3.0, "b": 1.0}, 1.0)[0] == "a"
    pool, why = policy.choose("reward", "a", ["a", "b", "c"],
                              {"a": 1.0, "b": 2.0, "c": 5.0}, 1.0)
    assert pool == "c" and "most room" in why
    assert policy.choose("reward", "a", ["a"], {"a": 1.0}, 1.0)[0] is None


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("placement", "{name}")
    assert desc.create({"headroom": 2.0}).headroom == 2.0
"""

BENCH = """\
\"\"\"Benchmark ``{name}``: ``rollart bench {name} [ARGS]`` calls ``main(argv)``.

A benchmark owns its arguments (``rollart bench {name} --help`` prints them), runs the
same workload against an honest baseline with repeats, prints a table and returns the
exit status. This template times a sorted() of random floats against a list copy.
\"\"\"

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from pydantic import BaseModel, ConfigDict


class {options}(BaseModel):
    \"\"\"Benchmarks take their options on the command line: nothing to configure here.\"\"\"

    model_config = ConfigDict(extra="forbid")


def {cls}(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rollart bench {name}", description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=10000, help="items per run")
    p.add_argument("--repeats", type=int, default=5, help="runs; the median is reported")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args(argv)
    data = [random.Random(0).random() for _ in range(args.size)]
    figures = {}
    for label, fn in (("copy (baseline)", list), ("sorted", sorted)):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn(data)
            times.append(time.perf_counter() - t0)
        figures[label] = statistics.median(times)
        print(f"{label:<16} median {figures[label] * 1e3:.3f} ms over {args.repeats} runs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f)
    return 0
"""

BENCH_TEST = """\
import json

import {package}.plugin as plugin
import pytest
from {package}.{module} import {cls}


def test_runs_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    assert {cls}(["--size", "100", "--repeats", "2", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())) == {"copy (baseline)", "sorted"}


def test_has_its_own_help(capsys):
    with pytest.raises(SystemExit):
        {cls}(["--help"])
    assert "--repeats" in capsys.readouterr().out


def test_registers(register_plugin):
    assert register_plugin(plugin).registry.get("benchmark", "{name}").load() is {cls}
"""

SCHEME = """\
\"\"\"Serverless URL scheme ``{name}://``: how a worker calls a function at such a URL.

The factory is called as ``{cls}(url, timeout_s)`` and returns a callable; calling it
invokes the remote function and returns its result (raise ``ServerlessError`` on
failure). This template maps ``{name}://host/path`` to the built-in JSON-over-HTTP caller.
\"\"\"

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict

from rollart_sdk.serverless import HttpJsonCaller


class {options}(BaseModel):
    \"\"\"A scheme is configured by its URL: nothing to set here.\"\"\"

    model_config = ConfigDict(extra="forbid")


class {cls}:
    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        http = urlparse(url)._replace(scheme="http").geturl()
        self._call = HttpJsonCaller(http, timeout_s)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)
"""

SCHEME_TEST = """\
import {package}.plugin as plugin
from {package}.{module} import {cls}

from rollart_sdk.serverless import serve_function


def test_calls_a_served_function():
    with serve_function(lambda a, b=0: a + b) as endpoint:
        url = endpoint.url.replace("http://", "{name}://")
        assert {cls}(url, timeout_s=10)(2, b=3) == 5


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("serverless_scheme", "{name}")
    assert desc.load() is {cls}
"""

# kind -> (backend module text, test text, README "How it works" paragraph)
KINDS: dict[str, tuple[str, str, str]] = {
    "env": (ENV, ENV_TEST, "`{cls}` (in `{package}/{module}.py`) is a gymnasium env with "
            "text observations and actions: it shows a word and rewards repeating it."),
    "reward": (REWARD, REWARD_TEST, "`{cls}.score` returns the environment's return plus a "
               "bonus when the trajectory succeeded."),
    "transport": (TRANSPORT, TRANSPORT_TEST, "`{cls}` publishes a version's buckets and "
                  "lets each engine worker fetch and verify them (pull style)."),
    "placement": (PLACEMENT, PLACEMENT_TEST, "`{cls}.choose` keeps headroom in the preferred "
                  "pool, else takes the compatible pool with the most room."),
    "benchmark": (BENCH, BENCH_TEST, "`{cls}(argv)` times a workload against a baseline "
                  "(median of repeats) and prints a table; `rollart bench {name} --help`."),
    "engine": (ENGINE, ENGINE_TEST, "`{cls}` batches requests continuously over a bigram "
               "table of logits: seeded sampling, abort, suspend/resume, weight updates."),
    "trainer": (TRAINER, TRAINER_TEST, "`{cls}.train_step` computes GRPO advantages and "
                "one PPO-clip step (Adam) on a Hugging Face causal LM, single process."),
    "serverless_scheme": (SCHEME, SCHEME_TEST, "`{cls}(url, timeout_s)` turns a "
                          "`{name}://` URL into a callable that invokes the function there."),
}
