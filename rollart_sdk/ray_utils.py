"""Starting and reaching Ray the way this project needs it (127.0.0.1, no dashboard)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rollart_sdk.ray_leftovers import descendants  # re-exported: its old home

# Worker output is quiet unless ROLLART_VERBOSE=1: no Hugging Face progress bars or
# advisory warnings in every worker's log lines.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def _verbose() -> bool:
    return os.environ.get("ROLLART_VERBOSE", "") not in ("", "0", "false", "no")


def local_ray_env() -> None:
    """Keep a local Ray on 127.0.0.1 (Ray 2.60 otherwise binds the routed address), keep
    each worker process to one torch/BLAS thread (processes share few cores), and keep
    worker output quiet (see ``QUIET_ENV``; ``ROLLART_VERBOSE=1`` keeps everything)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not sys.stdout.isatty():  # piped or captured: no ANSI colour codes in worker prefixes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if not _verbose():
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    resources: dict[str, float] | None = None,
    labels: dict[str, str] | None = None,
    **kwargs: Any,
) -> Any:
    """Connect to ``address`` (or RAY_ADDRESS), or start a local Ray bound to 127.0.0.1."""
    import ray

    local_ray_env()
    if ray.is_initialized():
        return ray.get_runtime_context()
    address = address or os.environ.get("RAY_ADDRESS")
    env_vars = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if not _verbose():
        env_vars.update(QUIET_ENV)
    runtime_env = {"env_vars": env_vars}
    if address:
        return ray.init(address=address, runtime_env=runtime_env, **kwargs)
    kwargs.setdefault("log_to_driver", True)
    return _start_local(dict(num_cpus=num_cpus, resources=resources or None,
                             labels=labels or None, runtime_env=runtime_env, **kwargs))


# Ray's own start-up gives its raylet 30 s to register (not configurable); on a loaded
# machine that is sometimes not enough. One more try, after the first one's processes
# are stopped.
_STARTUP_TIMEOUT = "timed out during startup"


def _start_local(kwargs: dict[str, Any]) -> Any:
    """Start this process's own local Ray: first stop what is left of the local Rays of
    earlier drivers that were killed (``rollart_sdk.ray_leftovers``), then record this
    one's processes for the next start."""
    import ray

    from rollart_sdk import ray_leftovers

    for attempt in (1, 2):
        stopped = ray_leftovers.stop_leftovers()
        if stopped:
            print(f"note: stopped {len(stopped)} leftover process(es) of the local Ray of an "
                  f"earlier run that was killed ({', '.join(stopped[:4])}"
                  f"{', ...' if len(stopped) > 4 else ''})", file=sys.stderr, flush=True)
        try:
            # "local": always start our own instance; with no address Ray would attach to
            # any cluster another process started here (/tmp/ray/ray_current_cluster).
            with ray_daemons_in_own_session(), workers_at_driver_niceness():
                ctx = ray.init(address="local", include_dashboard=False,
                               _node_ip_address="127.0.0.1", **kwargs)
        except Exception as exc:
            if attempt == 2 or _STARTUP_TIMEOUT not in str(exc):
                raise
            print(f"note: Ray's local start-up timed out ({exc}); trying once more",
                  file=sys.stderr, flush=True)
            ray.shutdown()
            ray_leftovers.stop_ray_below(os.getpid())  # what the failed start left
            continue
        ray_leftovers.record()
        return ctx
    raise AssertionError("unreachable")


NICENESS_ENV = "RAY_worker_niceness"  # Ray's worker_niceness setting (its default: 15)


@contextmanager
def workers_at_driver_niceness() -> Iterator[None]:
    """While a local Ray starts: its workers run at the driver's niceness, not 15 above it.

    Ray starts every worker process at nice +15 (its ``worker_niceness``, read from
    ``RAY_worker_niceness`` by the raylet when it starts). In the Ray layout the workers
    are the whole computation (trainer, engines, env hosts), so on a machine with any
    other work they would get a fraction of the CPU the in-process layout gets; Ray's own
    job manager sets 0 for the same reason. A value the user set is kept; a cluster the
    run joins (``--address``) keeps its own setting (this applies only to the Ray the
    SDK starts)."""
    if NICENESS_ENV in os.environ:
        yield
        return
    os.environ[NICENESS_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(NICENESS_ENV, None)


@contextmanager
def ray_daemons_in_own_session() -> Iterator[None]:
    """Start the processes of a local Ray (GCS, raylet, agents; the raylet's workers
    inherit its group) in a session of their own, not in the driver's process group.

    A stop signal sent to the driver's group (Ctrl-C in a terminal, ``kill -- -PGID``,
    ``timeout``, a process supervisor) otherwise reaches the GCS and the raylet as well:
    Ray blocks SIGINT in them but not SIGTERM, so they die while the driver still saves
    its final checkpoint, and the driver's own Ray client then waits 60 s for the GCS
    before it aborts ("Failed to connect to GCS within 60 seconds ... The program will
    terminate."). Apart, the driver stops the run and tears Ray down in order
    (``RaySpawner.close``). They still end with the driver should it die: Ray starts
    them with the kernel's parent-death signal (fate sharing) on Linux.

    Ray starts each such process with ``ray._private.services.ConsolePopen``; while
    Ray is started, that name is a subclass that asks for a new session. (Not on
    Windows, where Ray already gives each its own process group.)"""
    if sys.platform == "win32":
        yield
        return
    from ray._private import services

    original = services.ConsolePopen

    class _OwnSession(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    setattr(services, "ConsolePopen", _OwnSession)  # noqa: B010 - a class, typed as such
    try:
        yield
    finally:
        setattr(services, "ConsolePopen", original)  # noqa: B010


def actor_pids(actor_class: str, root: int | None = None) -> list[int]:
    """PIDs (sorted) of the Ray worker processes below ``root`` (default: this process; a
    local driver starts the raylet, which starts the workers) that run an actor of class
    ``actor_class``: Ray titles such a process ``ray::ActorClass`` (``.method()`` appended
    while one runs). For tests and benchmarks that kill a worker (``rollart bench soak
    --kill-engine-every``)."""
    tag = f"ray::{actor_class}"
    procs = descendants(os.getpid() if root is None else root)
    return sorted(p for p, cmd in procs.items() if tag in cmd)
