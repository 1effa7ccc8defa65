"""`rollart envs`: every installed environment with its options, turn budget and character.

The turn budget and the prefill/decode character are the env plugin's own statement
(``registry.register(..., traits={"turns": ..., "character": ...})``); the options come
from the env's options model (imported for this command only).
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticUndefined

from rollart_sdk.registry import Descriptor


def option_rows(desc: Descriptor) -> list[dict[str, Any]]:
    """name, default and description of each option (the plugin's options model)."""
    rows = []
    for name, field in desc.options_model().model_fields.items():
        if field.default is not PydanticUndefined:
            default = field.default
        elif field.default_factory is not None:
            default = field.get_default(call_default_factory=True)
        else:
            default = "(required)"
        rows.append({"name": name, "default": default, "description": field.description or ""})
    return rows


def describe(desc: Descriptor, with_options: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": desc.name,
        "plugin": desc.distribution or desc.plugin,
        "summary": desc.summary,
        "turns": desc.traits.get("turns"),
        "character": desc.traits.get("character"),
    }
    if with_options:
        try:
            out["options"] = option_rows(desc)
        except Exception as exc:  # noqa: BLE001 - a broken options import is reported, not fatal
            out["options_error"] = f"{type(exc).__name__}: {exc}"
    return out
