"""rollart-env-sandbox: the coding env end to end (tool calls, rewards, conformance)."""

from __future__ import annotations

import json

import pytest
import rollart_env_sandbox.plugin as plugin
from rollart_env_sandbox import SandboxCodeEnv, parse_tool_call, probe
from rollart_env_sandbox.tasks import generate, load_tasks

from rollart_sdk.testing.env import check_env

ISOLATION = probe()
needs_isolation = pytest.mark.skipif(
    not (ISOLATION.netns and ISOLATION.landlock),
    reason=f"no sandbox isolation on this machine: {'; '.join(ISOLATION.problems)}",
)
pytestmark = needs_isolation


def call(tool: str, **args) -> str:
    return "Let me act. " + json.dumps({"tool": tool, **args}) + " done."


def make(base, **options) -> SandboxCodeEnv:
    return SandboxCodeEnv(base_dir=str(base), wall_timeout_s=30, **options)


def test_conforms_to_check_env(open_dir):
    check_env(lambda: make(open_dir, max_tool_calls=4), seed=0)


def test_registered_through_the_hook(register_plugin, open_dir):
    desc = register_plugin(plugin, name="rollart-env-sandbox").registry.get("env", "sandbox")
    env = desc.create({"base_dir": str(open_dir), "task_ids": ["add-utils"]})
    assert isinstance(env, SandboxCodeEnv) and [t["id"] for t in env.tasks] == ["add-utils"]


def test_shipped_tasks_match_the_generator():
    assert load_tasks() == generate()  # the shipped file is what the generator writes
    assert len({t["id"] for t in generate()}) == len(generate()) >= 20


def test_every_task_fails_as_shipped_and_passes_with_its_fix(open_dir):
    """Run every task's tests in the sandbox twice: as shipped (some fail) and fixed (all pass)."""
    env = make(open_dir)
    for i, task in enumerate(env.tasks):
        env.tasks = [task]
        env.reset(seed=i)
        obs, *_ , info = env.step(call("run_tests"))
        assert 0 < info["total"] and info["passed"] < info["total"], (task["id"], obs)
        for path, text in task["fix"].items():
            env.step(call("write_file", path=path, content=text))
        obs, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 1.0 and info["success"], (task["id"], obs)


def test_an_episode_read_fix_test_submit(open_dir):
    env = make(open_dir, task_ids=["factorial-helpers"], scoring="fraction")
    obs, info = env.reset(seed=3)
    assert "factorial" in obs and "helpers.py" in obs and info["task_id"] == "factorial-helpers"
    obs, *_ = env.step(call("list_files"))
    assert obs.split() == ["helpers.py", "test_helpers.py"]
    obs, *_ = env.step(call("read_file", path="helpers.py"))
    assert "range(1, n)" in obs
    obs, reward, term, trunc, info = env.step(call("run_tests"))
    assert (reward, term, trunc) == (0.0, False, False)
    assert (info["passed"], info["total"]) == (2, 3) and "FAILED" in obs
    env.step(call("write_file", path="helpers.py", content=obs and
                  "def factorial(n):\n    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out\n"))
    obs, reward, term, _, info = env.step(call("submit"))
    assert term and reward == 1.0 and info["success"] and "3/3 tests passed" in obs
    assert env.sandbox is None  # the episode's directory is gone
    assert list(open_dir.glob("rollart-sandbox-*")) == []


def test_fraction_reward_and_truncation(open_dir):
    env = make(open_dir, task_ids=["fizzbuzz-utils"], scoring="fraction", max_tool_calls=2)
    env.reset(seed=0)
    _, reward, term, trunc, info = env.step("I am thinking")
    assert info["invalid_action"] and (reward, term, trunc) == (0.0, False, False)
    _, reward, term, trunc, info = env.step(call("submit"))
    assert term and reward == pytest.approx(3 / 4) and not info["success"]


def test_reset_starts_from_a_fresh_directory(open_dir):
    env = make(open_dir, task_ids=["add-utils"])
    env.reset(seed=0)
    first = env.sandbox.root
    env.step(call("write_file", path="notes.txt", content="left over"))
    env.reset(seed=0)
    assert not first.exists() and env.sandbox.root != first
    assert "notes.txt" not in env.step(call("list_files"))[0]
    env.close()
    assert list(open_dir.glob("rollart-sandbox-*")) == []


@pytest.mark.parametrize(
    ("text", "tool"),
    [('{"tool": "run_tests"}', "run_tests"), ('x {"a": 1} then {"tool": "submit"}', "submit"),
     ('{"tool": "rm -rf"}', None), ("submit", None), ("{broken json", None), (None, None)],
)
def test_parse_tool_call(text, tool):
    got = parse_tool_call(text)
    assert (got or {}).get("tool") == tool
