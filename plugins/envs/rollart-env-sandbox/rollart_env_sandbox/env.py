"""SWE-style coding at small scale: fix a tiny repository until its tests pass.

Each episode copies one task (a few files, a failing unittest) into a fresh
:class:`~rollart_env_sandbox.sandbox.Sandbox`. The model acts through tool calls written
as a JSON object anywhere in its reply::

    {"tool": "read_file", "path": "utils.py"}
    {"tool": "write_file", "path": "utils.py", "content": "def add(a, b): ..."}
    {"tool": "list_files"}
    {"tool": "run_tests"}
    {"tool": "submit"}

``run_tests`` and ``submit`` run ``python -m unittest`` jailed in the sandbox; ``submit``
ends the episode with reward 1.0 when every test passes (or the passing fraction, with
``scoring: fraction``). A reply with no valid tool call is a no-op step
(``info["invalid_action"]``); running out of turns truncates with reward 0.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any, Literal

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field

from rollart_env_sandbox.sandbox import (
    Limits,
    PathRefused,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    probe,
    sweep_stale,
)
from rollart_env_sandbox.tasks import load_tasks

TOOLS = ("read_file", "write_file", "list_files", "run_tests", "submit")
TEST_COMMAND = ("-I", "-B", "-m", "unittest", "discover", "-s", ".", "-t", ".", "-p", "test_*.py")
_RAN_RE = re.compile(r"Ran (\d+) tests?")
_FAILED_RE = re.compile(r"FAILED \((.*?)\)")
_CHARSET = string.printable


class SandboxOptions(BaseModel):
    """Options of env ``sandbox`` (``tasks[].env.options`` in a run config)."""

    model_config = ConfigDict(extra="forbid")

    tasks_path: str | None = Field(None, description="a JSON task list; default: the shipped set")
    task_ids: list[str] | None = Field(None, description="only these task ids (default: all)")
    max_tool_calls: int = Field(12, ge=1, le=200, description=(
        "replies (tool calls) per episode before truncation; set tasks[].max_turns at least "
        "as high"))
    scoring: Literal["all_pass", "fraction"] = Field(
        "all_pass", description="'all_pass': 1 when every test passes; 'fraction': passing share"
    )
    cpu_s: int = Field(5, ge=1, le=600, description="RLIMIT_CPU of a test run (seconds)")
    memory_mb: int = Field(512, ge=64, le=65536, description="RLIMIT_AS of a test run")
    file_size_mb: int = Field(8, ge=1, le=4096, description="RLIMIT_FSIZE: largest file written")
    max_procs: int = Field(32, ge=2, le=4096, description="RLIMIT_NPROC inside the sandbox")
    wall_timeout_s: float = Field(15.0, gt=0, le=3600, description="kill a test run after this")
    max_output_chars: int = Field(4000, ge=100, description="test output shown to the model")
    base_dir: str | None = Field(None, description="where sandboxes are made; default $TMPDIR")
    allow_network: bool = Field(
        False, description="run even where no network namespace can be made (code may reach the network)"
    )
    allow_unconfined_writes: bool = Field(
        False, description="run even without Landlock (code may write outside its directory)"
    )


def parse_tool_call(text: Any) -> dict[str, Any] | None:
    """The first JSON object in ``text`` with a known ``"tool"``, or None."""
    if not isinstance(text, str):
        return None
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("tool") in TOOLS:
            return obj
    return None


def test_counts(result: RunResult) -> tuple[int, int]:
    """(passed, total) from unittest's summary; (0, 0) when it never got to run tests."""
    if result.timed_out:
        return 0, 0
    ran = _RAN_RE.search(result.output)
    if not ran:
        return 0, 0
    total = int(ran.group(1))
    failed = _FAILED_RE.search(result.output)
    bad = 0
    if failed and result.returncode != 0:
        bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", failed.group(1)))
    elif result.returncode != 0:
        bad = total
    return max(0, total - bad), total


class SandboxCodeEnv(gymnasium.Env):
    """Fix the bug in a tiny repository through tool calls; every episode in its own sandbox."""

    metadata = {"render_modes": []}

    def __init__(self, **options: Any) -> None:
        self.options = o = SandboxOptions(**options)
        self.isolation = probe(o.base_dir)
        missing = []
        if not self.isolation.netns and not o.allow_network:
            missing.append("a network namespace (set allow_network: true to run without one)")
        if not self.isolation.landlock and not o.allow_unconfined_writes:
            missing.append("Landlock (set allow_unconfined_writes: true to run without it)")
        if missing:
            raise SandboxUnavailable(
                "env sandbox refuses to start: this machine lacks " + " and ".join(missing)
                + ". Tried: " + ("; ".join(self.isolation.problems) or "nothing")
            )
        tasks = load_tasks(o.tasks_path)
        if o.task_ids is not None:
            known = {t["id"] for t in tasks}
            unknown = sorted(set(o.task_ids) - known)
            if unknown:
                raise ValueError(f"unknown task ids {unknown}; known: {', '.join(sorted(known))}")
            tasks = [t for t in tasks if t["id"] in set(o.task_ids)]
        self.tasks = tasks
        self.limits = Limits(o.cpu_s, o.memory_mb, o.file_size_mb, o.max_procs, o.wall_timeout_s,
                             o.max_output_chars)
        self.observation_space = spaces.Text(max_length=100_000, min_length=1, charset=_CHARSET)
        self.action_space = spaces.Text(max_length=100_000, min_length=1, charset=_CHARSET)
        self.sandbox: Sandbox | None = None
        self.task: dict[str, Any] | None = None
        self._turns = 0
        self._done = False
        self.episodes = 0
        self.system_prompt = (
            "You are fixing a bug in a small Python repository. Act with exactly one tool call "
            "per reply, written as a JSON object: "
            '{"tool": "read_file", "path": "..."}, '
            '{"tool": "write_file", "path": "...", "content": "..."}, '
            '{"tool": "list_files"}, {"tool": "run_tests"} or {"tool": "submit"}. '
            "Paths are relative to the repository root. Submit when the tests pass."
        )
        if o.base_dir is not None:
            from pathlib import Path

            sweep_stale(Path(o.base_dir))

    # ---------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._close_sandbox()
        self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self.sandbox = Sandbox(self.options.base_dir, self.limits, self.isolation)
        for path, text in self.task["files"].items():
            self.sandbox.write(path, text)
        self._turns = 0
        self._done = False
        self.episodes += 1
        obs = (f"{self.task['issue']}\nFiles: {', '.join(sorted(self.task['files']))}\n"
               "Use the tools to read the code, fix it, run the tests and submit.")
        return obs, {"task_id": self.task["id"], "success": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.sandbox is None or self.task is None:
            raise RuntimeError("SandboxCodeEnv.step called before reset(); call reset() first")
        if self._done:
            raise RuntimeError("SandboxCodeEnv: the episode is over; call reset() first")
        self._turns += 1
        call = parse_tool_call(action)
        info: dict[str, Any] = {"task_id": self.task["id"], "tool": None, "invalid_action": False,
                                "success": False}
        reward, terminated = 0.0, False
        if call is None:
            info["invalid_action"] = True
            obs = "No tool call found. Reply with one JSON object such as {\"tool\": \"list_files\"}."
        else:
            info["tool"] = tool = call["tool"]
            try:
                obs, reward, terminated = self._tool(tool, call, info)
            except PathRefused as exc:
                info["refused"] = True
                obs = f"refused: {exc}"
        truncated = not terminated and self._turns >= self.options.max_tool_calls
        self._done = terminated or truncated
        if self._done:
            self._close_sandbox()
        return obs, float(reward), terminated, truncated, info

    def _tool(self, tool: str, call: dict[str, Any], info: dict[str, Any]) -> tuple[str, float, bool]:
        sb = self.sandbox
        assert sb is not None
        if tool == "read_file":
            return sb.read(str(call.get("path", ""))), 0.0, False
        if tool == "write_file":
            content = call.get("content")
            if not isinstance(content, str):
                raise PathRefused('write_file needs "content" (a string)')
            n = sb.write(str(call.get("path", "")), content)
            return f"wrote {n} characters to {call.get('path')}", 0.0, False
        if tool == "list_files":
            return "\n".join(sb.files()) or "(empty)", 0.0, False
        result = sb.run([self.isolation.python, *TEST_COMMAND])
        passed, total = test_counts(result)
        info.update(passed=passed, total=total, run=result.summary())
        report = f"{result.summary()}; {passed}/{total} tests passed\n{result.output}"
        if tool == "run_tests":
            return report, 0.0, False
        info["success"] = success = total > 0 and passed == total
        if self.options.scoring == "fraction":
            reward = passed / total if total else 0.0
        else:
            reward = 1.0 if success else 0.0
        return f"submitted: {report}", reward, True

    def _close_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def close(self) -> None:
        self._close_sandbox()
