"""An env's answers made safe to ship between processes: what every env host returns."""

from __future__ import annotations

from typing import Any


def text_observation(obs: Any, call: str) -> str:
    """An env's observation as the text the pipeline needs; a TypeError naming the type
    otherwise (it was stringified silently, hiding an env bug in the prompt). The env
    hosts raise it as the call's error, so the episode is dropped with the reason."""
    if not isinstance(obs, str):
        raise TypeError(
            f"env {call}() returned an observation of type {type(obs).__name__} "
            f"({str(obs)[:80]!r}); observations must be str: format it as text in the env")
    return obs


def plain_info(info: Any) -> dict[str, Any]:
    """Env info made safe to ship between processes (numpy scalars -> Python)."""
    out: dict[str, Any] = {}
    for k, v in dict(info or {}).items():
        if hasattr(v, "item") and callable(v.item):
            try:
                v = v.item()
            except (ValueError, TypeError):
                v = str(v)
        out[str(k)] = v
    return out
