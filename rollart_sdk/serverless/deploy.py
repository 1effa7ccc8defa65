"""Deploy any reward backend as a Ray Serve application that scales from zero (paper R3).

The data plane's serverless side: ``@register_serverless`` and reward ``serverless`` call a
function by URL; this module puts a registered reward backend behind such a URL.

The function holds no state between calls, so Ray Serve may run 0..N replicas of it:
``min_replicas: 0`` (the default) means no replica exists while nothing is scored; the
first request starts one (a cold start, about 2 s for a rule reward here, more for a judge
that loads a model), more start while ``target_ongoing_requests`` is exceeded, and they go
away after ``downscale_to_zero_delay_s`` idle. The HTTP ingress binds 127.0.0.1 unless
``host`` says otherwise.

Each request is checked before the backend sees it: ``Authorization: Bearer <token>``
(the deployment holds only the token's SHA-256, never the token), ``application/json``
only (no pickle over HTTP), a body of at most ``max_body_bytes``. Error answers carry an
error id, never the exception's text (that is logged by the replica under the id).

Used by ``rollart serve-reward CONFIG`` (a standalone service) and by reward
``serverless`` with ``deploy:`` (the run deploys the function on its own Ray cluster).
``check_exposure`` is the rule every reward server here applies before it listens.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollart_sdk.config import Backend
from rollart_sdk.errors import RollartError

log = logging.getLogger(__name__)

TOKEN_ENV = "ROLLART_REWARD_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, insecure: bool) -> list[str]:
    """Refuse an unauthenticated endpoint off loopback; warnings for what is allowed but risky."""
    if token is None and not insecure:
        raise SystemExit(
            f"error: no token: export {TOKEN_ENV} (or pass --token-env VAR) so that only "
            "callers with 'Authorization: Bearer <token>' are scored; --insecure serves "
            "without one on 127.0.0.1 only"
        )
    if token is None and not is_loopback(host):
        raise SystemExit(
            f"error: --insecure on {host}: anyone who reaches this address could post a "
            "trajectory and get any reward; use 127.0.0.1 or set a token"
        )
    warnings = []
    if not is_loopback(host):
        warnings.append(
            f"warning: serving on {host} (not a loopback address): the endpoint is reachable "
            "from other machines; keep the token secret and prefer TLS in front of it"
        )
    return warnings


class DeployOptions(BaseModel):
    """``tasks[].reward.options.deploy`` of reward ``serverless``."""

    model_config = ConfigDict(extra="forbid")

    via: Literal["ray-serve"] = "ray-serve"
    backend: Backend = Field(description="the reward backend to serve, e.g. {name: judge}")
    app: str | None = Field(None, description="Serve application name (default reward-<backend>)")
    host: str = Field("127.0.0.1", description="HTTP ingress address")
    port: int = Field(8123, ge=1, le=65535, description="HTTP ingress port (one per Ray cluster)")
    min_replicas: int = Field(0, ge=0, description="0: scale to zero when idle")
    max_replicas: int = Field(2, ge=1)
    target_ongoing_requests: float = Field(
        8, gt=0, description="in-flight requests per replica before another starts"
    )
    max_ongoing_requests: int = Field(32, ge=1, description="per replica; more wait in the proxy")
    upscale_delay_s: float = Field(0.5, ge=0)
    downscale_delay_s: float = Field(5.0, ge=0)
    downscale_to_zero_delay_s: float = Field(10.0, ge=0)
    num_cpus: float = Field(0.5, ge=0, description="Ray CPUs per replica")
    max_body_bytes: int = Field(1 << 20, ge=1024)
    warm_up: bool = Field(True, description="load the backend's model in the replica's "
                          "constructor (a cold start), before it takes traffic")
    replica_log: str | None = Field(
        None, description="a directory: each replica logs its life there (created, ready, "
        "busy intervals, heartbeats, closed; rollart_sdk.serverless.replica_log)")
    start_timeout_s: float = Field(
        300.0, gt=0, description="how long deploying may take until the application runs "
        "(its min_replicas scheduled and warmed up); past it the application is deleted and "
        "the deploy fails with its replicas' states, instead of waiting forever for a "
        "replica no node has room for")

    @model_validator(mode="after")
    def _bounds(self) -> DeployOptions:
        from rollart_sdk.plugins import get_registry

        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas "
                             f"({self.max_replicas})")
        if self.backend.name == "serverless":
            raise ValueError("deploy.backend is the function to serve (e.g. judge, rule), not "
                             "serverless itself")
        try:  # the served backend's own options, checked now rather than in a replica
            get_registry().get("reward", self.backend.name).validate_options(
                self.backend.options, where="deploy.backend.options")
        except RollartError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def app_name(self) -> str:
        return self.app or f"reward-{self.backend.name}"

    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/{self.app_name}"


def token_digest(token: str | None) -> str | None:
    return None if token is None else hashlib.sha256(token.encode()).hexdigest()


class RewardFunction:
    """The body of one replica: checks the request, then ``backend.score``."""

    def __init__(self, name: str, options: dict[str, Any], digest: str | None,
                 max_body_bytes: int, warm_up: bool = False,
                 replica_log: str | None = None) -> None:
        from rollart_sdk.plugins import get_registry
        from rollart_sdk.serverless.replica_log import ReplicaLog

        self.log = ReplicaLog(replica_log) if replica_log else None
        self.backend = get_registry().get("reward", name).create(options)
        self.digest = digest
        self.max_body = max_body_bytes
        self.started = time.time()
        self.calls = 0
        self.busy_s = 0.0
        if warm_up and callable(getattr(self.backend, "warm_up", None)):
            # On a thread of its own: the constructor may run inside an event loop.
            with ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, self.backend.warm_up()).result()
        if self.log is not None:
            self.log.write("ready")

    def close(self) -> None:
        """Release the backend (its model) and close the replica's log."""
        close = getattr(self.backend, "close", None)
        try:
            if callable(close):
                close()
        finally:
            if self.log is not None:
                self.log.close()

    def __del__(self) -> None:  # Ray Serve calls it when it stops the replica
        if getattr(self, "backend", None) is not None:
            self.close()
            self.backend = None

    def check(self, headers: Any, length: int | None) -> tuple[int, str] | None:
        if self.digest is not None:
            given = (headers.get("authorization") or "").removeprefix("Bearer ")
            if not hmac.compare_digest(token_digest(given) or "", self.digest):
                return 401, "unauthorized: send Authorization: Bearer <token>"
        if (headers.get("content-type") or "").split(";")[0].strip() != "application/json":
            return 415, "the body must be application/json"
        if length is None or not 0 <= length <= self.max_body:
            return 413, f"the body must be at most {self.max_body} bytes (Content-Length)"
        return None

    async def score_json(self, body: bytes) -> tuple[int, dict[str, Any]]:
        from rollart_sdk.types import RewardRequest

        try:
            request = RewardRequest(**json.loads(body)["args"][0])
        except (ValueError, KeyError, IndexError, TypeError):
            return 400, {"error": 'the body must be {"args": [<RewardRequest as JSON>]}'}
        t0 = time.monotonic()
        self.calls += 1
        if self.log is not None:
            self.log.begin()
        try:
            result = await self.backend.score(request)
        except Exception:  # logged with an id; the caller sees only the id
            error_id = uuid.uuid4().hex[:12]
            log.exception("reward function failed (error id %s)", error_id)
            return 500, {"error": f"the reward function failed (error id {error_id})"}
        finally:
            self.busy_s += time.monotonic() - t0
            if self.log is not None:
                self.log.end()
        details = dict(result.details)
        details["replica"] = {"calls": self.calls, "age_s": round(time.time() - self.started, 3)}
        return 200, {"result": {"reward": result.reward, "details": details}}


def _deployment(opts: DeployOptions) -> Any:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(
        name=opts.app_name,
        max_ongoing_requests=opts.max_ongoing_requests,
        ray_actor_options={"num_cpus": opts.num_cpus},
        # A stateless function has nothing to finish but its calls: stop within seconds.
        graceful_shutdown_wait_loop_s=0.5,
        graceful_shutdown_timeout_s=10.0,
        autoscaling_config={
            "min_replicas": opts.min_replicas,
            "initial_replicas": opts.min_replicas,
            "max_replicas": opts.max_replicas,
            "target_ongoing_requests": opts.target_ongoing_requests,
            "upscale_delay_s": opts.upscale_delay_s,
            "downscale_delay_s": opts.downscale_delay_s,
            "downscale_to_zero_delay_s": opts.downscale_to_zero_delay_s,
            "metrics_interval_s": 0.5,
            "look_back_period_s": 2.0,
        },
    )
    class ServedReward(RewardFunction):
        async def __call__(self, request: Request) -> JSONResponse:
            length = request.headers.get("content-length")
            declared = int(length) if length is not None and length.isdigit() else None
            refused = self.check(request.headers, declared)
            if refused is not None:
                return JSONResponse({"error": refused[1]}, status_code=refused[0])
            body = await request.body()
            if len(body) > self.max_body:
                return JSONResponse({"error": "body too large"}, status_code=413)
            code, out = await self.score_json(body)
            return JSONResponse(out, status_code=code)

    return ServedReward


# Ray 2.60 builds a RequestRouterConfig both for a new deployment (serve.deployment, bind,
# _run) and for every serve.status() answer, and each build registers, pickles and then
# UNregisters ray.serve._private.request_router with cloudpickle, a process-global set: two
# threads doing so at once (a ReplicaMonitor polling status while deploy() builds an app)
# fail with "... is not registered for pickle by value". Every Serve call here that builds
# one holds this lock.
SERVE_CONFIG_LOCK = threading.RLock()


def serve_status() -> Any:
    """``serve.status()`` under :data:`SERVE_CONFIG_LOCK` (see there)."""
    from ray import serve

    with SERVE_CONFIG_LOCK:
        return serve.status()


class DeployError(RollartError):
    """A Serve application did not start: it failed, or it was not running in time."""


POLL_S = 0.5  # how often deploy() reads the application's status while it starts
PROGRESS_S = 30.0  # how often it logs that the application is still starting


def deploy(opts: DeployOptions, token: str | None, wait: bool = True) -> str:
    """Deploy (or update) ``opts.backend`` on the connected Ray cluster; return its URL.

    ``wait``: return once the application runs (its ``min_replicas`` are up), at most
    ``opts.start_timeout_s``: past it (a replica no node has room for, a warm-up that
    stalls), or at once when Serve reports DEPLOY_FAILED, the application is deleted and
    :class:`DeployError` says why. False returns at once (poll :func:`replica_count`).
    Idempotent per application name: a second caller with the same options gets the URL
    of the running application."""
    from ray import serve
    from ray.serve.api import _run  # Ray 2.x: serve.run without waiting for RUNNING

    serve.start(http_options={"host": opts.host, "port": opts.port})
    with SERVE_CONFIG_LOCK:
        app = _deployment(opts).bind(opts.backend.name, opts.backend.options,
                                     token_digest(token), opts.max_body_bytes, opts.warm_up,
                                     opts.replica_log)
        # Not serve.run: in Ray 2.60 it waits for RUNNING with no timeout, so a replica that
        # can never be scheduled would hang the run at start without a word.
        _run(app, _blocking=False, name=opts.app_name, route_prefix=f"/{opts.app_name}")
    if wait:
        wait_running(opts)
    return opts.url()


def wait_running(opts: DeployOptions) -> None:
    """Poll ``opts.app_name`` until RUNNING, at most ``opts.start_timeout_s``. Raise
    :class:`DeployError` on DEPLOY_FAILED or past the deadline (after deleting the
    application), or when the application is gone meanwhile."""

    name = opts.app_name
    start = time.monotonic()
    deadline = start + opts.start_timeout_s
    next_log = start + PROGRESS_S
    while True:
        status = serve_status().applications.get(name)
        state = "NOT_STARTED" if status is None else _value(status.status)
        if state == "RUNNING":
            return
        now = time.monotonic()
        if state in ("DEPLOY_FAILED", "NOT_STARTED", "DELETING") or now >= deadline:
            break
        if now >= next_log:
            log.info("Serve application %s still %s after %.0f s: %s", name, state,
                     now - start, _describe(status))
            next_log = now + PROGRESS_S
        time.sleep(min(POLL_S, max(0.0, deadline - now)))
    detail = _describe(status)
    where = f"Serve application {name!r} (deploy of backend {opts.backend.name!r})"
    if state in ("NOT_STARTED", "DELETING"):
        raise DeployError(f"{where} is {state} while the deploy waited for it to run "
                          f"(deleted by another caller?): {detail}")
    ask = (f"each replica asks num_cpus {opts.num_cpus:g}, min_replicas "
           f"{opts.min_replicas}; {_cluster_cpus(opts.num_cpus)}")  # before the delete frees any
    deleted = _delete(name)
    if state == "DEPLOY_FAILED":
        raise DeployError(
            f"{where} failed to deploy: {detail}; {ask}; {deleted}. A replica's "
            "constructor raised (Serve's message has its error): fix deploy.backend or "
            "deploy.backend.options")
    raise DeployError(
        f"{where} still {state}, not RUNNING, after deploy.start_timeout_s="
        f"{opts.start_timeout_s:g} s: "
        f"{detail}; {ask}; {deleted}. A replica STARTING or PENDING_ALLOCATION is either "
        "waiting for a node with the CPUs it asks (the run's pools may hold them) or still "
        "in its constructor (warm_up loads the model there): lower deploy.num_cpus or "
        "deploy.min_replicas, or free CPUs from the pools, or raise deploy.start_timeout_s")


def _value(state: Any) -> str:
    return str(getattr(state, "value", state))


def _describe(status: Any) -> str:
    """An application's status in one line: its replicas by state and Serve's messages."""
    if status is None:
        return "the application does not exist"
    parts = []
    counts = states_of({"app": status}, ["app"])["app"]
    parts.append("replicas " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                                or "none yet"))
    if status.message:
        parts.append(f"Serve: {status.message}")
    for dep_name, dep in status.deployments.items():
        if dep.message:
            parts.append(f"deployment {dep_name} {_value(dep.status)}: {dep.message}")
    return "; ".join(parts)


def _cluster_cpus(num_cpus: float) -> str:
    """The cluster's CPUs beside what a replica asks (a hint: never raises)."""
    import ray

    try:
        total = ray.cluster_resources().get("CPU", 0.0)
        free = ray.available_resources().get("CPU", 0.0)
        largest = max((n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes()
                       if n.get("Alive")), default=0.0)
    except Exception as exc:  # noqa: BLE001 - the message is only a hint
        return f"the cluster's CPUs are unknown ({type(exc).__name__})"
    out = (f"the Ray cluster has {total:g} CPUs (the largest node {largest:g}), "
           f"{free:g} free now")
    if num_cpus > largest:
        out += f": no node can ever host a replica of num_cpus {num_cpus:g}"
    elif num_cpus > free:
        out += f": fewer than the {num_cpus:g} a replica asks"
    return out


def _delete(name: str) -> str:
    from ray import serve

    try:
        serve.delete(name)  # bounded: Ray 2.60 waits at most 60 s for the deletion
    except Exception as exc:  # noqa: BLE001 - the deploy's own error is what matters
        log.warning("deleting Serve application %s failed: %s", name, exc)
        return f"deleting the application failed ({type(exc).__name__}: {exc})"
    return "the application was deleted"


def replica_count(app: str, states: tuple[str, ...] = ("RUNNING",)) -> int:
    """Replicas of ``app``'s deployment in ``states`` (RUNNING: serving; add STARTING,
    STOPPING to count every replica holding resources). 0 when none or not deployed."""
    return replica_counts([app], states)[app]


def replica_counts(apps: Sequence[str], states: tuple[str, ...] = ("RUNNING",)
                   ) -> dict[str, int]:
    """:func:`replica_count` of several applications from ONE status call (the Serve
    controller's status is not free: poll it once for all)."""
    return {app: sum(n for state, n in by_state.items() if state in states)
            for app, by_state in replica_states(apps).items()}


def replica_states(apps: Sequence[str]) -> dict[str, dict[str, int]]:
    """Each application's replicas by state (``{"RUNNING": 1, "STOPPING": 1}``; empty when
    not deployed), from ONE ``serve.status()`` call."""
    return states_of(serve_status().applications, apps)


def states_of(applications: Any, apps: Sequence[str]) -> dict[str, dict[str, int]]:
    """:func:`replica_states` from a ``serve.status().applications`` snapshot."""
    out: dict[str, dict[str, int]] = {}
    for app in apps:
        status = applications.get(app)
        counts: dict[str, int] = {}
        for dep in ([] if status is None else status.deployments.values()):
            for state, n in dep.replica_states.items():
                key = str(getattr(state, "value", state))
                counts[key] = counts.get(key, 0) + n
        out[app] = counts
    return out


class ReplicaMonitor:
    """Polls the replicas of one application (or several, with one status call per poll)
    and records every change with its time (``rollart serve-reward`` prints them).

    Two histories per application, each a list of (seconds since start, count) at every
    change of that count:

    - ``histories``: replicas in ``states`` (default RUNNING; the reward bench passes
      STARTING + RUNNING + STOPPING: every replica holding resources, for
      :meth:`replica_seconds`). Held counts include a replica stopping beside its
      replacement starting, so they may exceed the deployment's ``max_replicas``.
    - ``running``: RUNNING replicas only (serving requests; never above
      ``max_replicas``). A rise is that many replicas started serving, a fall that many
      stopped serving (``starts`` / ``stops`` count them); the reward bench's
      ``replica_changes`` is this history's counts.
    """

    def __init__(self, app: str | Sequence[str], emit: Any = print, interval_s: float = 0.5,
                 states: tuple[str, ...] = ("RUNNING",)) -> None:
        self.apps = (app,) if isinstance(app, str) else tuple(app)
        self.states = states
        self.emit = emit
        self.interval_s = interval_s
        # per application: (seconds since start, replicas in ``states``) at every change
        self.histories: dict[str, list[tuple[float, int]]] = {a: [] for a in self.apps}
        # per application: (seconds since start, RUNNING replicas) at every change
        self.running: dict[str, list[tuple[float, int]]] = {a: [] for a in self.apps}
        self.starts: dict[str, int] = dict.fromkeys(self.apps, 0)  # RUNNING count rises
        self.stops: dict[str, int] = dict.fromkeys(self.apps, 0)  # RUNNING count falls
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"monitor-{self.apps[0]}",
                                        daemon=True)

    @property
    def app(self) -> str:
        return self.apps[0]

    @property
    def history(self) -> list[tuple[float, int]]:
        """The (first) application's changes."""
        return self.histories[self.apps[0]]

    def start(self) -> ReplicaMonitor:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                by_state = replica_states(self.apps)
            except Exception as exc:  # noqa: BLE001 - a status call can fail during shutdown
                self.emit(f"[{', '.join(self.apps)}] replica status unavailable: {exc}")
                continue
            self.observe(by_state, time.monotonic() - self.started)

    def observe(self, by_state: dict[str, dict[str, int]], now: float) -> None:
        """Record one poll (:func:`replica_states`' answer) taken ``now`` seconds after
        the start."""
        for app in self.apps:
            counts = by_state.get(app, {})
            held = sum(n for state, n in counts.items() if state in self.states)
            history = self.histories[app]
            if not history or history[-1][1] != held:
                before = history[-1][1] if history else 0
                history.append((now, held))
                self.emit(f"[{app}] replicas: {before} -> {held} at t={now:.1f}s")
            serving = counts.get("RUNNING", 0)
            running = self.running[app]
            before = running[-1][1] if running else 0
            if not running or before != serving:
                running.append((now, serving))
                self.starts[app] += max(0, serving - before)
                self.stops[app] += max(0, before - serving)

    def replica_seconds(self, until: float | None = None) -> float:
        """Integral of the replica count over the monitored time, summed over the apps."""
        total = 0.0
        for history in self.histories.values():
            if not history:
                continue
            end = until if until is not None else history[-1][0]
            for (t, n), (t_next, _) in zip(history, [*history[1:], (end, 0)], strict=True):
                total += n * max(0.0, min(t_next, end) - t)
        return total

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
