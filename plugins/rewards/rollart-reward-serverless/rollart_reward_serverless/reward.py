"""A reward backend that calls a serverless endpoint once per finished trajectory.

The call is the JSON form of :class:`rollart_sdk.types.RewardRequest`; the endpoint
answers ``{"reward": float, "details": {...}}`` (``rollart_reward_serverless.serve`` serves
any installed reward backend that way). The URL's scheme picks the transport of the data
plane (``http``, ``https``, ``fc`` or a plugin's), as ``@register_serverless`` does.
Calls run off the event loop, with a timeout and a bounded number of retries: a flaky
endpoint costs time, never a hang, and a dead one fails only the trajectories it scores.

An outage (HTTP 5xx, timeouts, a cold start) opens the endpoint's circuit: the calls that
come meanwhile **wait** (up to ``outage_wait_s``) instead of failing at once, and go on
when a trial call succeeds; so a short outage costs time, not trajectories, and does not
trip the run's drop-rate rule. Refused credentials (HTTP 401 / 403) are not an outage: the
call fails at once with the endpoint's answer, and the run stops within seconds naming it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import time
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollart_sdk.resources.decorators import known_schemes
from rollart_sdk.serverless import ServerlessError, ServerlessProxy
from rollart_sdk.serverless.deploy import DeployOptions
from rollart_sdk.types import RewardRequest, RewardResult


class ServerlessRewardOptions(BaseModel):
    """Options of reward ``serverless`` (``tasks[].reward.options``)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        None, description="endpoint, e.g. http://127.0.0.1:8000/ or fc://host/path; with "
        "deploy: defaults to the deployed application's URL"
    )
    deploy: DeployOptions | None = Field(
        None, description="deploy the function on the run's Ray cluster (Ray Serve, scales "
        "from zero) before the first call; see rollart_sdk.serverless.deploy"
    )
    timeout_s: float = Field(30.0, gt=0, description="per call")
    retries: int = Field(2, ge=0, le=10, description="extra attempts after a failed call")
    backoff_s: float = Field(
        0.2, ge=0, description="wait before retry k: backoff_s * 2**k, jittered by +-50 %"
    )
    token_env: str | None = Field(
        None, description="environment variable holding a bearer token, sent as "
        "'Authorization: Bearer <token>' (the token itself never appears in a config or log)"
    )
    headers_env: dict[str, str] = Field(
        default_factory=dict, description="header name -> environment variable holding its "
        "value (e.g. a function URL's own auth header)"
    )
    breaker_failures: int = Field(
        5, ge=1, description="consecutive failed calls that open the endpoint's circuit"
    )
    breaker_cooldown_s: float = Field(
        10.0, ge=0, description="an open circuit holds calls back for this long, then "
        "lets one trial call through"
    )
    outage_wait_s: float = Field(
        120.0, ge=0, description="how long a call waits in all for an open circuit to close "
        "before it fails (CircuitOpenError, with the endpoint's last error); 0: fail at once"
    )

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str | None) -> str | None:
        if url is None:
            return url
        scheme = urlparse(url).scheme
        if scheme not in known_schemes():
            raise ValueError(
                f"no serverless transport for scheme {scheme!r}; known: "
                f"{', '.join(sorted(known_schemes()))}"
            )
        return url

    @model_validator(mode="after")
    def _where(self) -> ServerlessRewardOptions:
        if self.url is None and self.deploy is None:
            raise ValueError("give url (an endpoint) or deploy (a backend to serve), or both")
        return self


class CircuitOpenError(ServerlessError):
    """Calls to an endpoint are refused for a while after repeated failures."""


class CredentialsRefused(ServerlessError):
    """The endpoint answered HTTP 401 / 403: not an outage, a wrong or missing token."""


class CircuitBreaker:
    """Per endpoint: after ``failures`` consecutive failed calls the circuit opens and calls
    fail at once for ``cooldown_s``; then one trial call goes through (half-open): success
    closes the circuit, failure opens it again. A dead endpoint so costs one timeout per
    cooldown, not one per trajectory and retry."""

    def __init__(self, failures: int, cooldown_s: float) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.consecutive = 0
        self.opened_at: float | None = None
        self.trial_running = False
        self.opened = 0  # times the circuit opened
        self.last_error = ""  # the last failure's text: the cause an open circuit names

    def admit(self, url: str) -> None:
        if self.opened_at is None:
            return
        waited = time.monotonic() - self.opened_at
        if waited < self.cooldown_s or self.trial_running:
            raise CircuitOpenError(
                f"circuit open for {url} after {self.consecutive} consecutive failures "
                f"(retrying in {max(0.0, self.cooldown_s - waited):.1f} s); last error: "
                f"{self.last_error[:500]}"
            )
        self.trial_running = True

    def retry_in(self) -> float:
        """Seconds until the cooldown ends (0 when it has; a trial may be running)."""
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.cooldown_s - (time.monotonic() - self.opened_at))

    def abandon(self) -> None:
        """A call ended without a verdict on the endpoint (its caller was cancelled, e.g.
        at the reward timeout or a stop): a half-open trial frees its place, so the next
        call after the cooldown is the trial (otherwise the circuit stayed open for good)."""
        self.trial_running = False

    def record(self, ok: bool, error: str = "") -> None:
        self.trial_running = False
        if error:
            self.last_error = error
        if ok:
            self.consecutive, self.opened_at = 0, None
            return
        self.consecutive += 1
        if self.consecutive >= self.failures and (
            self.opened_at is None or time.monotonic() - self.opened_at >= self.cooldown_s
        ):
            self.opened_at = time.monotonic()
            self.opened += 1


_BREAKERS: dict[str, CircuitBreaker] = {}


def breaker_for(url: str, failures: int, cooldown_s: float) -> CircuitBreaker:
    """The one breaker of ``url`` in this process (shared by every backend calling it)."""
    if url not in _BREAKERS:
        _BREAKERS[url] = CircuitBreaker(failures, cooldown_s)
    return _BREAKERS[url]


def _credentials(token_env: str | None, headers_env: dict[str, str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    missing = [v for v in [token_env, *headers_env.values()] if v and v not in os.environ]
    if missing:
        raise ServerlessError(
            f"reward serverless: environment variable(s) {', '.join(missing)} not set (they "
            "hold the endpoint's credentials; export them before the run)"
        )
    if token_env:
        headers["Authorization"] = f"Bearer {os.environ[token_env]}"
    for name, var in headers_env.items():
        headers[name] = os.environ[var]
    return headers


class ServerlessReward:
    """Reward ``serverless``: one HTTP/JSON call per trajectory (options documented on
    :class:`ServerlessRewardOptions`). With ``deploy`` the function is first deployed on
    the connected Ray cluster (idempotent), then called like any endpoint."""

    def __init__(self, url: str | None = None, timeout_s: float = 30.0, retries: int = 2,
                 backoff_s: float = 0.2, token_env: str | None = None,
                 headers_env: dict[str, str] | None = None, breaker_failures: int = 5,
                 breaker_cooldown_s: float = 10.0, outage_wait_s: float = 120.0,
                 deploy: DeployOptions | dict[str, Any] | None = None) -> None:
        headers = _credentials(token_env, headers_env or {})
        if deploy is not None:
            from rollart_sdk.serverless.deploy import deploy as deploy_app

            opts = DeployOptions.model_validate(deploy)
            token = os.environ[token_env] if token_env else None
            deployed = deploy_app(opts, token)
            url = url or deployed
        if url is None:
            raise ServerlessError("reward serverless: give url or deploy")
        self.url = url
        self.retries = retries
        self.backoff_s = backoff_s
        self.outage_wait_s = outage_wait_s
        self.token_env = token_env
        self._proxy = ServerlessProxy(url, timeout_s, headers)
        self.breaker = breaker_for(url, breaker_failures, breaker_cooldown_s)

    async def score(self, request: RewardRequest) -> RewardResult:
        payload = dataclasses.asdict(request)
        last: Exception | None = None
        deadline = time.monotonic() + self.outage_wait_s
        attempt = tries = 0
        while attempt <= self.retries:
            await self._admit(deadline)  # an open circuit: wait for it (bounded)
            tries += 1
            try:
                answer = await self._proxy.acall(payload)
                result = _result(request.trajectory_id, answer, self.url, tries - 1)
            except ServerlessError as exc:
                if exc.status in (401, 403):  # not an outage: say it now, do not wait
                    self.breaker.abandon()
                    raise CredentialsRefused(
                        f"reward endpoint {self.url} refused the credentials: {exc}; check "
                        + (f"the token in ${self.token_env}" if self.token_env else
                           "tasks[].reward.options.token_env (no token was sent)"),
                        status=exc.status) from None
                self.breaker.record(ok=False, error=str(exc))
                last = exc
                # A failure while the circuit is open is the outage's, not this call's: it
                # does not use up a retry; the call waits for the circuit (to the deadline).
                if not self._in_outage(deadline):
                    attempt += 1
                    if attempt <= self.retries:
                        await asyncio.sleep(
                            self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
                continue
            except BaseException:  # cancelled (reward timeout, stop) or a bug: no verdict
                self.breaker.abandon()
                raise
            self.breaker.record(ok=True)
            return result
        raise ServerlessError(
            f"reward endpoint {self.url} failed {tries} time(s) for trajectory "
            f"{request.trajectory_id}: {last}"
        )

    def _in_outage(self, deadline: float) -> bool:
        return self.breaker.opened_at is not None and time.monotonic() < deadline

    async def _admit(self, deadline: float) -> None:
        """Return when the circuit lets a call through; while it is open, wait (polling,
        at most until ``deadline``), then raise the CircuitOpenError naming the last error."""
        while True:
            try:
                self.breaker.admit(self.url)
                return
            except CircuitOpenError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, max(0.05, min(self.breaker.retry_in(), 0.5))))


def _result(trajectory_id: str, answer: Any, url: str, attempt: int) -> RewardResult:
    if not isinstance(answer, dict) or "reward" not in answer:
        raise ServerlessError(
            f"reward endpoint {url} must answer {{'reward': float, 'details': {{...}}}}, "
            f"got {answer!r:.200}"
        )
    try:
        reward = float(answer["reward"])
    except (TypeError, ValueError):
        raise ServerlessError(f"reward endpoint {url} answered a non-number reward "
                              f"{answer['reward']!r:.80}") from None
    if not math.isfinite(reward):
        raise ServerlessError(f"reward endpoint {url} answered a non-finite reward {reward}")
    details = dict(answer.get("details") or {})
    details.update({"endpoint": url, "attempts": attempt + 1})
    return RewardResult(trajectory_id, reward, details)
