"""A reward backend that calls a serverless endpoint once per finished trajectory.

The call is the JSON form of :class:`rollart_sdk.types.RewardRequest`; the endpoint
answers ``{"reward": float, "details": {...}}`` (``rollart_reward_serverless.serve`` serves
any installed reward backend that way). The URL's scheme picks the transport of the data
plane (``http``, ``https``, ``fc`` or a plugin's), as ``@register_serverless`` does.
Calls run off the event loop, with a timeout and a bounded number of retries: a flaky
endpoint costs time, never a hang, and a dead one fails only the trajectories it scores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollart_sdk.cluster.serverless import ServerlessError, ServerlessProxy, known_schemes
from rollart_sdk.types import RewardRequest, RewardResult


class ServerlessRewardOptions(BaseModel):
    """Options of reward ``serverless`` (``tasks[].reward.options``)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="endpoint, e.g. http://127.0.0.1:8000/ or fc://host/path")
    timeout_s: float = Field(30.0, gt=0, description="per call")
    retries: int = Field(2, ge=0, le=10, description="extra attempts after a failed call")
    backoff_s: float = Field(0.2, ge=0, description="wait before retry k: backoff_s * 2**k")

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str) -> str:
        scheme = urlparse(url).scheme
        if scheme not in known_schemes():
            raise ValueError(
                f"no serverless transport for scheme {scheme!r}; known: "
                f"{', '.join(sorted(known_schemes()))}"
            )
        return url


class ServerlessReward:
    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 2,
                 backoff_s: float = 0.2) -> None:
        self.url = url
        self.retries = retries
        self.backoff_s = backoff_s
        self._proxy = ServerlessProxy(url, timeout_s)

    async def score(self, request: RewardRequest) -> RewardResult:
        payload = dataclasses.asdict(request)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                answer = await self._proxy.acall(payload)
                return _result(request.trajectory_id, answer, self.url, attempt)
            except ServerlessError as exc:
                last = exc
                if attempt < self.retries:
                    await asyncio.sleep(self.backoff_s * 2**attempt)
        raise ServerlessError(
            f"reward endpoint {self.url} failed {self.retries + 1} time(s) for trajectory "
            f"{request.trajectory_id}: {last}"
        )


def _result(trajectory_id: str, answer: Any, url: str, attempt: int) -> RewardResult:
    if not isinstance(answer, dict) or "reward" not in answer:
        raise ServerlessError(
            f"reward endpoint {url} must answer {{'reward': float, 'details': {{...}}}}, "
            f"got {answer!r:.200}"
        )
    reward = float(answer["reward"])
    if not math.isfinite(reward):
        raise ServerlessError(f"reward endpoint {url} answered a non-finite reward {reward}")
    details = dict(answer.get("details") or {})
    details.update({"endpoint": url, "attempts": attempt + 1})
    return RewardResult(trajectory_id, reward, details)
