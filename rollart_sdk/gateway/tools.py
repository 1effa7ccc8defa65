"""Model output -> OpenAI ``tool_calls``, one parser per model family.

A parser takes the generated text and returns ``(content, calls)``; ``calls`` is None when
the text holds no tool call, and a malformed call is left in ``content`` as plain text
(counted by the gateway, never an HTTP error).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

ToolParser = Callable[[str], tuple[str, list[dict[str, Any]] | None, int]]

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _call(obj: Any) -> dict[str, Any] | None:
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args)}}


def parse_hermes(text: str) -> tuple[str, list[dict[str, Any]] | None, int]:
    """Hermes / Qwen 2.5 / Qwen 3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    blocks. Returns the text outside well-formed blocks, the calls, and how many blocks
    were malformed (those stay in the text)."""
    calls: list[dict[str, Any]] = []
    bad = 0
    kept: list[str] = []
    last = 0
    for m in _HERMES.finditer(text):
        try:
            call = _call(json.loads(m.group(1)))
        except ValueError:
            call = None
        if call is None:
            bad += 1
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append(call)
    kept.append(text[last:])
    if not calls:
        return text, None, bad
    return "".join(kept).strip(), calls, bad


def parse_none(text: str) -> tuple[str, list[dict[str, Any]] | None, int]:
    """No tool calls: the text is the content."""
    return text, None, 0


PARSERS: dict[str, ToolParser] = {"hermes": parse_hermes, "none": parse_none}


def tool_parser(name: str) -> ToolParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; choose one of "
                         f"{', '.join(sorted(PARSERS))}") from None
