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


class UnknownBackendError(RollartError):
    """A config names a backend no installed plugin registers."""

    def __init__(self, kind: str, name: str, installed: list[str], hint: str = "") -> None:
        import difflib

        self.kind, self.name, self.installed = kind, name, installed
        self.hint = hint
        self.suggestions = difflib.get_close_matches(name, installed, n=3)
        names = ", ".join(sorted(installed)) or "(none)"
        msg = f"unknown {kind} {name!r}"
        if self.suggestions:
            msg += f"; did you mean {' or '.join(repr(s) for s in self.suggestions)}?"
        msg += f"; installed {kind}s: {names}."
        if hint:
            msg += f" {hint}"
        super().__init__(msg)


class BackendStartError(RollartError):
    """A task's backend could not be constructed (its deploy failed, its model did not
    load): the message names the task and the backend, then the backend's own reason."""


class PlacementError(RollartError):
    """No pool can host a worker."""
