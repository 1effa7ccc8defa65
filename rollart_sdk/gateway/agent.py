"""An agent as an environment: ``async def run(client, task) -> result``.

Subclass :class:`AgentEnv`, register it as an env (``rollart_register_envs``) and select it
by name in a task's ``env``. It lives on the task's env host like any env (its own
process on the env workers by default), with the env timeouts, pools and failure
accounting; the control plane recognises it as an agent and, instead of stepping it turn
by turn, opens an episode on the gateway and lets the agent drive:

- ``reset(seed)`` draws the episode's task (``task(seed)``; a GRPO group shares a seed, so
  its members get the same task);
- ``step(handle)`` (``handle``: the episode's base URL, token and model name, as JSON) runs
  ``run(client, task)`` to its end with an ``openai.AsyncOpenAI`` bound to the episode, and
  returns the result as one terminal step.

``run`` returns a number (the reward), a string (the final answer, for the task's reward
backend: e.g. ``rule`` ``exact_match`` against ``task["answer"]``), or an
:class:`AgentResult` with both and info.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


@dataclass
class AgentResult:
    """What an agent's ``run`` returns: a reward (None: the reward backend decides from
    ``answer``), the final answer text, and info (kept on the trajectory)."""

    reward: float | None = None
    answer: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def _result(value: Any) -> AgentResult:
    if isinstance(value, AgentResult):
        return value
    if isinstance(value, bool) or value is None:
        raise TypeError(f"an agent's run returned {value!r}; return a reward (float), the "
                        "final answer (str) or an AgentResult")
    if isinstance(value, (int, float)):
        return AgentResult(reward=float(value))
    if isinstance(value, str):
        return AgentResult(answer=value)
    raise TypeError(f"an agent's run returned {type(value).__name__}; return a reward "
                    "(float), the final answer (str) or an AgentResult")


class AgentEnv:
    """Base class of agent envs. Implement ``task(seed)`` and ``async run(client, task)``.

    ``self.model`` is the served model's name to pass as ``model=`` (set before ``run``).
    Class attributes: ``system_prompt`` (unused by the gateway: an agent sends its own),
    ``tool_parser`` (how generated text becomes ``tool_calls``: ``auto``, the default,
    chooses from the model's chat template; or ``hermes``, ``llama3_json``, ``mistral``,
    ``none``).

    An exception out of ``run`` drops the episode with its reason, unless
    :meth:`on_error` scores it: override that for the failures the *model* causes (the
    Agents SDK's ``ModelBehaviorError`` for a reply cut by the token limit or a call to
    an unknown tool, its ``MaxTurnsExceeded``), so that the policy is trained on them with
    a low reward instead of never seeing them."""

    is_agent = True  # what the control plane looks for
    tool_parser = "auto"
    system_prompt: str | None = None
    model = "policy"

    def task(self, seed: int) -> Any:
        raise NotImplementedError("an AgentEnv implements task(seed): the episode's task")

    async def run(self, client: Any, task: Any) -> AgentResult | float | str:
        raise NotImplementedError("an AgentEnv implements async run(client, task)")

    def on_error(self, exc: Exception) -> AgentResult | None:
        """The episode's result when ``run`` raised ``exc``: None (the default) drops the
        episode with the exception as its reason; an ``AgentResult`` scores it (its turns
        are trained; ``info["agent_error"]`` names the exception)."""
        return None

    # ------------------------------------------------------------------ env protocol
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._task = self.task(0 if seed is None else seed)
        info: dict[str, Any] = {"task": self._task}
        if isinstance(self._task, dict) and "answer" in self._task:
            info["answer"] = self._task["answer"]  # ground truth for a rule reward
        text = self._task if isinstance(self._task, str) else json.dumps(self._task, default=str)
        return text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        try:
            handle = json.loads(action)
            base_url, api_key = handle["base_url"], handle["api_key"]
        except (ValueError, TypeError, KeyError):
            raise ValueError("an AgentEnv is stepped once, with its episode's handle (JSON "
                             "base_url, api_key, model) by the control plane") from None
        self.model = handle.get("model", self.model)
        try:
            result = _result(asyncio.run(self._run(base_url, api_key)))
        except Exception as exc:
            scored = self.on_error(exc)
            if scored is None:
                raise
            result = scored
            result.info.setdefault("agent_error", f"{type(exc).__name__}: {exc}"[:500])
        if result.reward is not None and not math.isfinite(result.reward):
            raise ValueError(f"the agent returned reward {result.reward}; return a finite one")
        info = {"task": self._task, **result.info}
        if isinstance(self._task, dict) and "answer" in self._task:
            info.setdefault("answer", self._task["answer"])
        return result.answer, float(result.reward or 0.0), True, False, info

    async def _run(self, base_url: str, api_key: str) -> Any:
        import openai

        # No retries: a refused request (the episode ended) is final, and a retry would be
        # a second turn the trajectory never asked for.
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                      timeout=3600) as client:
            return await self.run(client, self._task)


class ImportedAgentOptions(BaseModel):
    """Options of the built-in env ``agent``: an agent function named by import string."""

    model_config = ConfigDict(extra="forbid")

    run: str = Field(description="'module:function', async def run(client, task) -> result")
    tasks: str | list[Any] = Field(
        description="'module:function' (seed -> task), or a list of tasks (task seed % len)")
    tool_parser: str = Field("auto", description="auto (from the chat template), hermes, "
                             "llama3_json, mistral or none")
    error_rewards: dict[str, float] = Field(
        default_factory=dict, description="exceptions (class names, e.g. the Agents SDK's "
        "ModelBehaviorError, MaxTurnsExceeded) that score the episode with this reward "
        "(trained on) instead of dropping it: the model's own failures")

    @field_validator("tool_parser")
    @classmethod
    def _known(cls, v: str) -> str:
        from rollart_sdk.gateway.tools import tool_parser

        tool_parser(v)  # ValueError naming the choices
        return v

    @field_validator("error_rewards")
    @classmethod
    def _finite(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: r for k, r in v.items() if not math.isfinite(r)}
        if bad:
            raise ValueError(f"error_rewards must be finite rewards, got {bad}")
        return v

    @field_validator("tasks")
    @classmethod
    def _some(cls, v: str | list[Any]) -> str | list[Any]:
        if isinstance(v, list) and not v:
            raise ValueError("tasks is empty; give at least one task")
        return v


class ImportedAgent(AgentEnv):
    """The built-in env ``agent``: ``run`` and ``tasks`` imported by name (the module must
    be importable where the task's envs live: the env workers share this machine's
    PYTHONPATH)."""

    def __init__(self, run: str, tasks: str | list[Any], tool_parser: str = "auto",
                 error_rewards: dict[str, float] | None = None) -> None:
        from rollart_sdk.registry import import_string

        self.error_rewards = dict(error_rewards or {})
        self._fn = import_string(run)
        if not callable(self._fn):
            raise TypeError(f"run {run!r} is not a function; give 'module:function'")
        self._tasks = import_string(tasks) if isinstance(tasks, str) else list(tasks)
        self.tool_parser = tool_parser

    def task(self, seed: int) -> Any:
        if isinstance(self._tasks, list):
            return self._tasks[seed % len(self._tasks)]
        return self._tasks(seed)

    async def run(self, client: Any, task: Any) -> AgentResult | float | str:
        result: AgentResult | float | str = await self._fn(client, task)
        return result

    def on_error(self, exc: Exception) -> AgentResult | None:
        """``error_rewards``' reward for an exception of a class it names (or a subclass)."""
        for cls in type(exc).__mro__:
            if cls.__name__ in self.error_rewards:
                return AgentResult(reward=self.error_rewards[cls.__name__])
        return None
