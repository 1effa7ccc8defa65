"""The env hosts' errors, one set for every host (process, inline, thread, sim).

The EnvManager turns them into a trajectory's drop reason
(:func:`rollart_sdk.control.env_manager._env_reason`): :class:`EnvHung` is
``env_<call>_timeout``, anything else ``env_<call>_failed`` with the env's own text.
A Ray actor's error reaches the caller wrapped (``RayTaskError(EnvHung)``: still an
``EnvHung``, its text prefixed ``ray::``), so the caller reads the class first and the
text second.
"""

from __future__ import annotations

MAX_ERROR_CHARS = 2000  # characters of an env's exception text sent back


class EnvCallError(RuntimeError):
    """The env raised (the text is the env's ``Type: message``), or a host refused the
    call (a thread host while too many of its calls hang)."""


class EnvHung(TimeoutError):
    """An env call outlived its timeout. ``killed``: the env's process was killed (a
    process host); False: the call was given up and its thread runs on, it cannot be
    killed (a thread host)."""

    def __init__(self, message: str, killed: bool = True) -> None:
        super().__init__(message)
        self.killed = killed

    def __reduce__(self) -> tuple[type[EnvHung], tuple[str, bool]]:
        # Pickled across processes (Ray) with its ``killed`` flag.
        return type(self), (str(self), self.killed)


class EnvProcessDied(RuntimeError):
    """The env's process exited during a call (a crash of the env or of Python)."""


def error_text(exc: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """An exception as ``Type: message`` (at most ``limit`` characters), as hosts send it."""
    return f"{type(exc).__name__}: {exc}"[:limit]


# The thread and inline hosts' former names (rollart_sdk.cluster.inline_env), kept for one
# release: a refused or failed call is an EnvCallError, a call past its timeout an EnvHung.
InlineEnvCallError = EnvCallError
InlineEnvHung = EnvHung
