"""Model output -> OpenAI ``tool_calls``, one parser per model family.

A parser takes the generated text (special tokens kept) and returns ``(content, calls,
malformed)``; ``calls`` is None when the text holds no tool call, and a malformed call is
left in ``content`` as plain text (counted by the gateway, never an HTTP error).

- ``hermes``: Hermes / Qwen 2.5 / Qwen 3, ``<tool_call>{...}</tool_call>`` blocks;
- ``llama3_json``: Llama 3.1 / 3.2 / 3.3, a JSON object ``{"name", "parameters"}`` as the
  whole reply, optionally after ``<|python_tag|>``, several joined by ``;``;
- ``mistral``: Mistral v0.3 / Nemo, ``[TOOL_CALLS] [{"name", "arguments", "id"}, ...]``,
  and the newer ``[TOOL_CALLS]name[ARGS]{...}``;
- ``none``: no tool calls; ``auto``: chosen from the model's chat template
  (:func:`parser_for_template`).
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from collections.abc import Callable
from typing import Any

ToolParser = Callable[[str], tuple[str, list[dict[str, Any]] | None, int]]

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _call(obj: Any, call_id: str | None = None) -> dict[str, Any] | None:
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
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


_DECODER = json.JSONDecoder()
_LLAMA_END = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def _objects(text: str, sep: str | None = None) -> list[Any] | None:
    """Consecutive JSON values in ``text`` joined by ``sep`` (and whitespace; no ``sep``:
    one value only); None when anything else is there."""
    out, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        try:
            value, at = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        out.append(value)
        rest = text[at:].lstrip()
        if not rest:
            return out
        if sep is None or not rest.startswith(sep):
            return None
        at = len(text) - len(rest) + len(sep)


def _strip_end(text: str, ends: tuple[str, ...]) -> str:
    text = text.rstrip()
    for end in ends:
        if text.endswith(end):
            return text[:-len(end)].rstrip()
    return text


def parse_llama3_json(text: str) -> tuple[str, list[dict[str, Any]] | None, int]:
    """Llama 3.x JSON tool calls: the reply is ``{"name": ..., "parameters": {...}}`` (the
    chat template's own format for custom tools), optionally after ``<|python_tag|>``;
    several calls joined by ``;``. Text before ``<|python_tag|>`` is the content; a reply
    that starts like a call but does not parse is kept as content and counted. Builtin
    tools' ``name.call(...)`` syntax is not parsed (it stays content)."""
    head, tag, body = text.partition("<|python_tag|>")
    if not tag:
        head, body = "", text
    body = _strip_end(body, _LLAMA_END)
    if not body.lstrip().startswith("{"):
        return text, None, 0
    objs = _objects(body, ";")
    calls = [_call(o) for o in objs] if objs is not None else [None]
    if any(c is None for c in calls):
        return text, None, 1
    return head.strip(), [c for c in calls if c is not None], 0


def _mistral_id(obj: Any) -> str:
    given = obj.get("id") if isinstance(obj, dict) else None
    if isinstance(given, str) and len(given) == 9 and given.isalnum():
        return given  # the model's own id: the template renders it back the same
    return secrets.token_hex(5)[:9]  # Mistral's templates require 9 alphanumerics


def _mistral_calls(body: str) -> list[dict[str, Any]] | None:
    body = _strip_end(body, ("</s>",))
    if "[ARGS]" in body:  # v11+: name[ARGS]{...}, one per [TOOL_CALLS]
        name, _, args = body.partition("[ARGS]")
        objs = _objects(args)
        if objs is None or len(objs) != 1 or not name.strip():
            return None
        call = _call({"name": name.strip(), "arguments": objs[0]}, _mistral_id(None))
        return [call] if call is not None else None
    objs = _objects(body)
    if objs is None or len(objs) != 1:
        return None
    items = objs[0] if isinstance(objs[0], list) else [objs[0]]
    calls = [_call(o, _mistral_id(o)) for o in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def parse_mistral(text: str) -> tuple[str, list[dict[str, Any]] | None, int]:
    """Mistral: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments", "id"}``
    (v0.3, Nemo; the model's 9-character id is kept) or ``name[ARGS]{...}`` per call
    (v11+ tokenizers). The text before the first ``[TOOL_CALLS]`` is the content."""
    parts = text.split("[TOOL_CALLS]")
    if len(parts) == 1:
        return text, None, 0
    calls: list[dict[str, Any]] = []
    for body in parts[1:]:
        got = _mistral_calls(body)
        if got is None:
            return text, None, 1
        calls += got
    return parts[0].strip(), calls, 0


PARSERS: dict[str, ToolParser] = {"hermes": parse_hermes, "llama3_json": parse_llama3_json,
                                  "mistral": parse_mistral, "none": parse_none}


def parser_for_template(template: str | None) -> str:
    """The parser a chat template's own tool-call format asks for: ``[TOOL_CALLS]``
    (Mistral), ``<|python_tag|>`` or ``"parameters": `` (Llama 3.x), else ``hermes``
    (Qwen's and Hermes' ``<tool_call>``, and the default for templates without tools)."""
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or '"parameters": ' in t:
        return "llama3_json"
    return "hermes"


def tool_parser(name: str, template: str | None = None) -> ToolParser:
    """The parser named ``name``; ``auto``: the one ``template`` asks for."""
    if name == "auto":
        name = parser_for_template(template)
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; choose one of auto, "
                         f"{', '.join(sorted(PARSERS))}") from None
