"""``tool_choice``: ``"required"`` and a named function force a tool call by prompt tokens.

An OpenAI server guarantees a tool call for ``tool_choice: "required"`` or
``{"type": "function", "function": {"name": N}}``. vLLM does it with guided decoding (a
JSON-schema grammar masks the logits of every sampled token). Here the trainer recomputes
the log-probs of the task's *unconstrained* policy, so a mask would make the recorded
behaviour log-probs those of another policy. Instead the gateway writes the opening of the
call as the model's chat template writes it - e.g. ``<tool_call>\\n{"name": "calculator",
"arguments":`` for Hermes/Qwen - after the generation prompt, as **prompt** tokens: the
engine continues from there, the trained sample's completion holds only the tokens the
engine sampled, and the forced tokens sit in the prompt part (loss mask 0), counted
(``forced_prefix_tokens``). The call is then parsed from the forced text plus the
completion; a completion that does not finish a call is returned as plain content and
counted (``forced_tool_call_failed``), never an HTTP error.

The opener is derived from the template (:func:`template_opener`: render the request's
messages plus an assistant turn holding a probe call, and take the text between the
generation prompt and the probe's name and arguments), checked against the task's tool
parser; when the template does not render calls in the parser's format, the parser's own
opener (:data:`OPENERS`) is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollart_sdk.gateway.episode import GatewayError
from rollart_sdk.gateway.tools import PARSERS, ToolParser

# The parser's own opening of a call: (text before the name, text between the name and
# the arguments). Used when the chat template does not render calls in the parser's format.
OPENERS: dict[str, tuple[str, str]] = {
    "hermes": ('<tool_call>\n{"name": "', '", "arguments": '),
    "llama3_json": ('{"name": "', '", "parameters": '),
    "mistral": ('[TOOL_CALLS] [{"name": "', '", "arguments": '),
}
# Where a call begins, per parser (searched backwards from the probe's name).
_ANCHORS = {"hermes": "<tool_call>", "llama3_json": "{", "mistral": "[TOOL_CALLS]"}
PROBE_NAME = "rollart_probe_function"
PROBE_ARGS = {"rollart_probe_argument": 1}


@dataclass(frozen=True)
class ToolChoice:
    """A request's ``tool_choice``: ``mode`` is auto, none, required or function."""

    mode: str = "auto"
    name: str | None = None  # the function, for mode "function"

    @property
    def forces(self) -> bool:
        return self.mode in ("required", "function")


def _tool_names(tools: list[Any] | None) -> list[str]:
    names = []
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def parse_tool_choice(body: dict[str, Any], tools: list[Any] | None) -> ToolChoice:
    """The request's ``tool_choice``, or a 400 saying what is wrong with it."""
    value = body.get("tool_choice")
    if value is None or value == "auto":
        return ToolChoice()
    if value == "none":
        return ToolChoice("none")
    names = _tool_names(tools)
    if value == "required":
        choice = ToolChoice("required")
    elif (isinstance(value, dict) and value.get("type") == "function"
          and isinstance(value.get("function"), dict)
          and isinstance(value["function"].get("name"), str)):
        choice = ToolChoice("function", value["function"]["name"])
    else:
        raise GatewayError(400, "tool_choice must be 'auto', 'none', 'required' or "
                           "{'type': 'function', 'function': {'name': NAME}}, got "
                           f"{value!r}", param="tool_choice")
    if not names:
        raise GatewayError(400, f"tool_choice {value!r} needs tools: send the functions "
                           "in tools", param="tool_choice")
    if choice.name is not None and choice.name not in names:
        raise GatewayError(400, f"tool_choice names function {choice.name!r}, which is not "
                           f"in tools ({', '.join(names)})", param="tool_choice")
    return choice


def parser_name(parser: ToolParser) -> str | None:
    """The built-in name of a parser function (None for another function)."""
    return next((k for k, v in PARSERS.items() if v is parser), None)


def _probe_message() -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "rollart01", "type": "function",
         "function": {"name": PROBE_NAME, "arguments": dict(PROBE_ARGS)}}]}


def _parses_probe(parser: ToolParser, text: str) -> bool:
    _, calls, _ = parser(text)
    if not calls or len(calls) != 1 or calls[0]["function"]["name"] != PROBE_NAME:
        return False
    try:
        return bool(json.loads(calls[0]["function"]["arguments"]) == PROBE_ARGS)
    except ValueError:
        return False


def template_opener(render_turn: Callable[[list[dict[str, Any]], list[Any] | None], str],
                    prompt_text: str, messages: list[dict[str, Any]], tools: list[Any] | None,
                    parser: str) -> tuple[str, str] | None:
    """The chat template's own opening of a call after ``prompt_text`` (the render of
    ``messages`` with the generation prompt), as ``(before the name, name to
    arguments)``; None when the template does not render a call the parser reads.

    ``render_turn`` renders messages without the generation prompt. The template's text
    after the generation prompt is taken whole when the render with the probe call extends
    ``prompt_text`` (e.g. Qwen 3's empty think block comes with it); otherwise (a
    template that moves the system message to the last user turn, as Mistral Nemo's) from
    the parser's anchor (``<tool_call>``, ``[TOOL_CALLS]``, ``{``) before the name."""
    try:
        full = render_turn([*messages, _probe_message()], tools)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe
        return None
    at_name = full.rfind(f"{PROBE_NAME}")
    at_args = full.find('{"rollart_probe_argument"', at_name)
    if at_name < 0 or at_args < 0:
        return None
    if full.startswith(prompt_text) and len(prompt_text) <= at_name:
        start = len(prompt_text)
    else:
        start = full.rfind(_ANCHORS[parser], 0, at_name)
        if start < 0:
            return None
    if not _parses_probe(PARSERS[parser], full[start:]):
        return None
    return full[start:at_name], full[at_name + len(PROBE_NAME):at_args]


def forced_text(choice: ToolChoice, opener: tuple[str, str], tools: list[Any] | None) -> str:
    """The text appended to the prompt: the opener up to the arguments for a named
    function or ``required`` with one tool, else (``required``, several tools) up to the
    name. Trailing whitespace is left to the model (a BPE tokenizer joins it to the next
    token: ``": {"`` is sampled as ``":`` then `` {``)."""
    names = _tool_names(tools)
    name = choice.name if choice.mode == "function" else (names[0] if len(names) == 1
                                                          else None)
    before, between = opener
    if name is None:
        return before.rstrip()
    return (before + name + between).rstrip()
