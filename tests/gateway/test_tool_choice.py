"""``tool_choice`` "required" / a named function: the opening of a call the gateway writes
as prompt tokens, derived from the real chat templates (tests/data/chat_templates and
examples/templates) per parser, and its validation. No model, no server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rollart_sdk.gateway.episode import (
    Choice,
    EpisodeRecord,
    GatewayError,
    for_template,
    takes_string_arguments,
)
from rollart_sdk.gateway.forcing import (
    OPENERS,
    ToolChoice,
    forced_text,
    parse_tool_choice,
    template_opener,
)
from rollart_sdk.gateway.tools import PARSERS, parser_for_template
from rollart_sdk.types import GenerationResult

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "chat_templates"


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": f"The {name} tool.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}


ONE = [_tool("calculator")]
TWO = [_tool("calculator"), _tool("search")]
ASK = [{"role": "system", "content": "You calculate."}, {"role": "user", "content": "2 + 3?"}]


def _template(name: str) -> str:
    path = DATA / f"{name}.jinja"
    if not path.is_file():
        path = ROOT / "examples" / "templates" / f"{name}.jinja"
    return path.read_text()


def _renderer(name: str, generation: bool) -> Any:
    from transformers.utils.chat_template_utils import render_jinja_template

    template = _template(name)

    def render(messages: list[dict[str, Any]], tools: list[Any] | None) -> str:
        messages = for_template(messages, takes_string_arguments(template))
        out, _ = render_jinja_template([messages], tools=tools, chat_template=template,
                                       add_generation_prompt=generation, bos_token="<s>",
                                       eos_token="</s>")
        return str(out[0])

    return render


def _opener(name: str, tools: list[Any] = ONE) -> tuple[str, str] | None:
    parser = parser_for_template(_template(name))
    prompt = _renderer(name, True)(ASK, tools)
    return template_opener(_renderer(name, False), prompt, ASK, tools, parser)


@pytest.mark.parametrize("name,parser,before,between", [
    ("qwen2.5", "hermes", '<tool_call>\n{"name": "', '", "arguments": '),
    ("smollm2_tools", "hermes", '<tool_call>\n{"name": "', '", "arguments": '),
    ("qwen3", "hermes", '<think>\n\n</think>\n\n<tool_call>\n{"name": "', '", "arguments": '),
    ("llama-3.1", "llama3_json", '{"name": "', '", "parameters": '),
    ("llama-3.2", "llama3_json", '{"name": "', '", "parameters": '),
    ("mistral-v0.3", "mistral", '[TOOL_CALLS] [{"name": "', '", "arguments": '),
    # Nemo moves the system message to the last user turn: found from [TOOL_CALLS].
    ("mistral-nemo", "mistral", '[TOOL_CALLS][{"name": "', '", "arguments": '),
])
def test_the_opener_is_the_templates_own(name: str, parser: str, before: str,
                                         between: str) -> None:
    assert parser_for_template(_template(name)) == parser
    assert _opener(name) == (before, between)
    # Forced opener + what a model then writes (the template's own render of the rest of
    # a call) parses as the call: the opener is the parser's format.
    tail = {"hermes": '{"expression": "2 + 3"}}\n</tool_call>',
            "llama3_json": '{"expression": "2 + 3"}}',
            "mistral": '{"expression": "2 + 3"}}]'}[parser]
    forced = forced_text(ToolChoice("function", "calculator"), (before, between), ONE)
    assert forced == (before + "calculator" + between).rstrip()  # ends '"arguments":'
    _, calls, bad = PARSERS[parser](forced + " " + tail)
    assert bad == 0 and calls is not None and calls[0]["function"]["name"] == "calculator"
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "2 + 3"}


def test_required_forces_the_name_only_with_one_tool() -> None:
    opener = OPENERS["hermes"]
    assert forced_text(ToolChoice("required"), opener, ONE) == \
        '<tool_call>\n{"name": "calculator", "arguments":'
    # Several tools: the model chooses the name; the opener stops before it.
    assert forced_text(ToolChoice("required"), opener, TWO) == '<tool_call>\n{"name": "'
    assert forced_text(ToolChoice("function", "search"), opener, TWO) == \
        '<tool_call>\n{"name": "search", "arguments":'
    assert forced_text(ToolChoice("required"), OPENERS["llama3_json"], TWO) == '{"name": "'


def test_a_template_without_tool_calls_gives_no_opener() -> None:
    """SmolLM2's own template ignores tools and cannot render a call: the gateway then
    uses the parser's own opener (OPENERS)."""
    assert _opener("smollm2") is None


def test_tool_choice_values_and_refusals() -> None:
    assert parse_tool_choice({}, ONE) == ToolChoice()
    assert parse_tool_choice({"tool_choice": "auto"}, None) == ToolChoice()
    assert parse_tool_choice({"tool_choice": "none"}, ONE) == ToolChoice("none")
    assert parse_tool_choice({"tool_choice": "required"}, ONE).forces
    named = {"type": "function", "function": {"name": "search"}}
    assert parse_tool_choice({"tool_choice": named}, TWO) == ToolChoice("function", "search")
    for body, tools, says in [
        ({"tool_choice": "always"}, ONE, "must be 'auto'"),
        ({"tool_choice": {"type": "function"}}, ONE, "must be 'auto'"),
        ({"tool_choice": "required"}, None, "needs tools"),
        ({"tool_choice": named}, ONE, "'search', which is not in tools (calculator)"),
    ]:
        with pytest.raises(GatewayError, match=re.escape(says)) as err:
            parse_tool_choice(body, tools)
        assert err.value.status == 400 and err.value.param == "tool_choice"


def test_forced_text_is_prompt_and_continues_the_segment() -> None:
    """The forced text is in the prompt (its ids end ``ids``, the turn's obs), the turn's
    action ids are the generated ones only, and the next request (the call rendered back,
    then the tool's result) continues the segment on those tokens."""
    render = _renderer("qwen2.5", True)
    record = EpisodeRecord(render, lambda t: [ord(c) for c in t],
                           lambda ids: "".join(chr(i) for i in ids),
                           _renderer("qwen2.5", False))
    forced = '<tool_call>\n{"name": "calculator", "arguments":'
    prompt = record.prompt(ASK, ONE, forced)
    assert prompt.text == render(ASK, ONE) + forced
    assert prompt.forced_ids == [ord(c) for c in forced]
    assert prompt.ids[-len(forced):] == prompt.forced_ids
    generated = ' {"expression": "2 + 3"}}\n</tool_call><|im_end|>'
    ids = [ord(c) for c in generated]
    result = GenerationResult("r", ids, [-0.1] * len(ids), [0] * len(ids), "stop")
    call = {"id": "call_1", "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}
    reply = {"role": "assistant", "content": "", "tool_calls": [call]}
    record.record(prompt, ASK, [Choice(result, reply)])
    turn = record.segments[0].turns[0]
    assert turn.action_ids == ids and turn.obs_ids[-len(forced):] == prompt.forced_ids
    nxt = [*ASK, reply, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    second = record.prompt(nxt, ONE)
    assert second.continues
    assert "".join(map(chr, second.new_ids)) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
