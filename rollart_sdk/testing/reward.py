"""Conformance kit for reward backends.

Call it from a plugin's tests with requests and the rewards you expect::

    from rollart_sdk.testing.reward import check_reward, make_request

    def test_conforms():
        check_reward(MyReward(), [(make_request(responses=["42"], info={"answer": "42"}), 1.0)])

Every failure is an ``AssertionError`` whose message starts with
``check_reward[<property>]``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from rollart_sdk.types import RewardRequest, RewardResult

__all__ = ["check_reward", "make_request"]

T = TypeVar("T")
TOLERANCE = 1e-6


def _fail(prop: str, msg: str) -> AssertionError:
    return AssertionError(f"check_reward[{prop}]: {msg}")


def make_request(
    responses: Sequence[str] = ("",),
    info: dict[str, Any] | None = None,
    env_return: float = 0.0,
    terminated: bool = True,
    trajectory_id: str = "traj-0",
    tag: str = "test",
    prompt: str = "",
) -> RewardRequest:
    """A :class:`RewardRequest` with defaults for the fields a test does not care about."""
    return RewardRequest(
        trajectory_id=trajectory_id,
        tag=tag,
        prompt=prompt,
        responses=list(responses),
        env_return=env_return,
        terminated=terminated,
        info=dict(info or {}),
    )


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="check_reward")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _check_result(result: Any, request: RewardRequest, where: str) -> float:
    if not isinstance(result, RewardResult):
        raise _fail(
            "returns_result", f"{where}: score() must return RewardResult, got {result!r:.80}"
        )
    if result.trajectory_id != request.trajectory_id:
        raise _fail(
            "trajectory_id",
            f"{where}: result.trajectory_id {result.trajectory_id!r} != request's "
            f"{request.trajectory_id!r}; the control plane matches results by this id",
        )
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise _fail("reward_is_float", f"{where}: reward must be a float, got {reward!r}")
    if not math.isfinite(reward):
        raise _fail("reward_is_float", f"{where}: reward must be finite, got {reward!r}")
    if not isinstance(result.details, dict):
        raise _fail(
            "details", f"{where}: details must be a dict, got {type(result.details).__name__}"
        )
    try:
        json.dumps(result.details)
    except (TypeError, ValueError) as exc:
        raise _fail(
            "details", f"{where}: details must be JSON-serialisable (they are logged): {exc}"
        ) from exc
    return float(reward)


def check_reward(
    backend: Any, cases: Sequence[tuple[RewardRequest, float | None]]
) -> list[RewardResult]:
    """Assert that ``backend`` follows :class:`rollart_sdk.interfaces.RewardBackend`.

    ``cases`` are ``(request, expected reward or None)``. Properties checked, each named
    in the failure message:

    - ``score_is_async``: ``score`` is a coroutine function;
    - ``returns_result`` / ``trajectory_id``: a RewardResult for the same trajectory;
    - ``reward_is_float``: a finite number; ``details``: a JSON-serialisable dict;
    - ``deterministic``: scoring a request twice gives the same reward;
    - ``concurrent``: all cases scored at once (``asyncio.gather``, twice over) give the
      same rewards as one at a time;
    - ``expected``: the reward matches the expected value (within 1e-6) when given.

    Returns the results of the first sequential pass, one per case.
    """
    if not cases:
        raise _fail("cases", "give at least one (request, expected) case")
    score = getattr(backend, "score", None)
    if not callable(score):
        raise _fail("score_is_async", f"{type(backend).__name__} has no score() method")
    if not inspect.iscoroutinefunction(score):
        raise _fail(
            "score_is_async",
            f"{type(backend).__name__}.score must be 'async def' (it is awaited by the control "
            "plane and may call remote services)",
        )
    requests = [req for req, _ in cases]

    async def sequential() -> list[RewardResult]:
        return [await backend.score(req) for req in requests]

    async def concurrent() -> list[RewardResult]:
        return list(await asyncio.gather(*(backend.score(req) for req in requests * 2)))

    first = _run(sequential())
    rewards = [
        _check_result(r, req, f"case {i}")
        for i, (r, req) in enumerate(zip(first, requests, strict=True))
    ]

    again = _run(sequential())
    for i, (result, req) in enumerate(zip(again, requests, strict=True)):
        value = _check_result(result, req, f"case {i} (second call)")
        if not math.isclose(value, rewards[i], abs_tol=TOLERANCE):
            raise _fail(
                "deterministic",
                f"case {i}: scoring the same request twice gave {rewards[i]} then {value}",
            )

    together = _run(concurrent())
    for j, (result, req) in enumerate(zip(together, requests * 2, strict=True)):
        i = j % len(requests)
        value = _check_result(result, req, f"case {i} (concurrent)")
        if not math.isclose(value, rewards[i], abs_tol=TOLERANCE):
            raise _fail(
                "concurrent",
                f"case {i}: {value} under asyncio.gather vs {rewards[i]} alone; score() must "
                "not share mutable state between calls",
            )

    for i, (reward, (_, expected)) in enumerate(zip(rewards, cases, strict=True)):
        if expected is not None and not math.isclose(reward, expected, abs_tol=TOLERANCE):
            details = first[i].details
            raise _fail(
                "expected", f"case {i}: reward {reward} != expected {expected}; details: {details}"
            )
    return first
