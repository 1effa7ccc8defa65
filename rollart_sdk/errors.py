"""Errors a user can act on: each says what was wrong, where, and what to do."""

from __future__ import annotations


class RollartError(Exception):
    """Base of every error the SDK raises on purpose."""


class ConfigError(RollartError):
    """A run configuration is invalid. ``problems`` lists (where, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        head = f"invalid configuration{f' in {source}' if source else ''}:"
        body = "\n".join(f"  {where}: {msg}" for where, msg in problems)
        super().__init__(f"{head}\n{body}")


class PluginError(RollartError):
    """A plugin failed to load, or two plugins conflict."""


# An unknown name lists every installed name up to this many; past it the closest few and
# a count, with the command that lists them all (a GEM install registers ~130 envs).
LIST_ALL_UP_TO = 12
CLOSEST = 5


def closest(name: str, installed: list[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The ``n`` installed names most like ``name``, best first, those scoring at least
    ``cutoff``: difflib's ratio, case-folded, against the whole name and against its last
    part (``Mastermind-v0-easy`` of ``gem/game:Mastermind-v0-easy``); a name that
    contains what was typed scores at least 0.8."""
    import difflib
    import re

    typed = name.casefold()

    def score(candidate: str) -> float:
        full = candidate.casefold()
        tail = re.split(r"[/:]", full)[-1]
        whole = difflib.SequenceMatcher(None, typed, full).ratio()
        best = max(whole, difflib.SequenceMatcher(None, typed, tail).ratio())
        best = max(best, 0.8) if typed and typed in full else best
        return best + whole / 1000  # a tie goes to the name that is closer as a whole

    ranked = sorted(((score(c), c) for c in installed), key=lambda sc: (-sc[0], sc[1]))
    return [c for s, c in ranked[:n] if s >= cutoff]


def name_list(kind: str, name: str, installed: list[str]) -> str:
    """The installed names of ``kind`` for an error about ``name``: all of them when few,
    else the closest few, how many more, and where to see them all."""
    if not installed:
        return "(none)"
    if len(installed) <= LIST_ALL_UP_TO:
        return ", ".join(sorted(installed))
    near = closest(name, installed, n=CLOSEST, cutoff=0.0)
    where = {"env": "rollart envs", "benchmark": "rollart bench"}.get(
        kind, f"rollart plugins --kind {kind}")
    return f"{', '.join(near)} ... and {len(installed) - len(near)} more: `{where}`"


class UnknownBackendError(RollartError):
    """A config names a backend no installed plugin registers."""

    def __init__(self, kind: str, name: str, installed: list[str], hint: str = "") -> None:
        self.kind, self.name, self.installed = kind, name, installed
        self.hint = hint
        self.suggestions = closest(name, installed, n=3)
        msg = f"unknown {kind} {name!r}"
        if self.suggestions:
            msg += f"; did you mean {' or '.join(repr(s) for s in self.suggestions)}?"
        msg += f"; installed {kind}s: {name_list(kind, name, installed)}."
        if hint:
            msg += f" {hint}"
        super().__init__(msg)


class BackendStartError(RollartError):
    """A task's backend could not be constructed (its deploy failed, its model did not
    load): the message names the task and the backend, then the backend's own reason."""


class PlacementError(RollartError):
    """No pool can host a worker."""


class EngineDeadError(RollartError):
    """An engine backend's own engine is gone inside a live worker (vLLM's engine core
    process killed, e.g. by the OOM killer): the worker cannot serve again. An engine
    plugin raises it (or an exception of the same name, as vLLM's own
    ``EngineDeadError``) from its calls; the engine worker then exits its process so that
    Ray restarts it, and the control plane treats it as a dead worker."""


class EngineLostError(EngineDeadError):
    """:class:`EngineDeadError` of a worker that nothing restarts (in the driver's
    process, not a Ray actor): EngineRecovery gives it up at once."""


def is_engine_dead(exc: BaseException) -> bool:
    """True for an exception that says the worker's engine backend is dead
    (:class:`EngineDeadError`, or vLLM's exception of that name), also as Ray's
    ``RayTaskError`` subclass of it, or raised from one (a ``WeightSyncError`` whose
    ``load_weights`` met the dead engine)."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if any(c.__name__ == "EngineDeadError" for c in type(at).__mro__):
            return True
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return False


def is_worker_death(exc: BaseException) -> bool:
    """True for Ray's errors that mean the worker's process is gone (or restarting), for
    an engine restarted but not reloaded yet (``EngineRestartedError``: Ray raises it
    as a ``RayTaskError`` subclass of it), and for an engine whose backend died inside
    it (:func:`is_engine_dead`: its process exits and is restarted)."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"RayActorError", "ActorDiedError", "ActorUnavailableError",
                         "EngineRestartedError", "EngineDeadError"})
