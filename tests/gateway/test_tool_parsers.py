"""Tool-call parsers on the real chat templates' own formats (tests/data/chat_templates).

A model trained on a template writes a tool call the way the template renders one; so
each parser is tested on the template's render of an assistant tool call, and the parsed
call rendered back by the template gives the same text (the next request then continues
the segment on the model's own tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollart_sdk.gateway.episode import for_template, normalize_messages, takes_string_arguments
from rollart_sdk.gateway.tools import (
    parse_hermes,
    parse_llama3_json,
    parse_mistral,
    parser_for_template,
    tool_parser,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}]
ASK = [{"role": "system", "content": "You add."}, {"role": "user", "content": "2 + 3?"}]


def _render(name: str, messages: list[dict[str, Any]], generation: bool = False) -> str:
    """The template's render, as the gateway renders (tool call arguments as the
    template takes them)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = (DATA / f"{name}.jinja").read_text()
    messages = for_template(messages, takes_string_arguments(template))
    rendered, _ = render_jinja_template([messages], tools=TOOLS, chat_template=template,
                                        add_generation_prompt=generation, bos_token="<s>",
                                        eos_token="</s>")
    return str(rendered[0])


def _generated(name: str, call_id: str) -> str:
    """What a model trained on template ``name`` writes for add(2, 3): the template's
    render of that assistant turn, after the generation prompt."""
    call = {"id": call_id, "type": "function",
            "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    prompt = _render(name, ASK, generation=True)
    full = _render(name, [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}])
    if name.startswith("mistral"):  # no generation prompt: the turn follows [/INST]
        prompt = full[:full.rindex("[/INST]") + len("[/INST]")]
    assert full.startswith(prompt), (prompt, full)
    return full[len(prompt):]


@pytest.mark.parametrize("name,parse,end", [
    ("llama-3.1", parse_llama3_json, "<|eot_id|>"),
    ("llama-3.2", parse_llama3_json, "<|eot_id|>"),
    ("mistral-v0.3", parse_mistral, "</s>"),
    ("mistral-nemo", parse_mistral, "</s>"),
    ("qwen2.5", parse_hermes, "<|im_end|>\n"),
])
def test_a_call_in_the_templates_format_parses_and_renders_back_the_same(
        name: str, parse: Any, end: str) -> None:
    generated = _generated(name, "abc123xyz")
    assert parser_for_template((DATA / f"{name}.jinja").read_text()) == parse.__name__[6:]
    text = generated[:-len(end)] if generated.endswith(end) else generated
    content, calls, bad = parse(text)
    assert bad == 0 and calls is not None and len(calls) == 1, (generated, content)
    assert calls[0]["function"]["name"] == "add"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert content == ""
    # The reply as the agent sends it back renders the model's text again.
    reply = normalize_messages([{"role": "assistant", "content": None, "tool_calls": calls}])
    again = _render(name, [*ASK, *reply])
    assert again.endswith(generated), (again, generated)


def test_llama_python_tag_and_several_calls() -> None:
    text = ('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; '
            '{"name": "add", "parameters": {"a": 3, "b": 4}}<|eom_id|>')
    content, calls, bad = parse_llama3_json(text)
    assert bad == 0 and calls is not None and content == ""
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"a": 1, "b": 2}, {"a": 3, "b": 4}]
    # Plain prose is content; a reply that starts like a call but breaks is counted.
    assert parse_llama3_json("The answer is 5.") == ("The answer is 5.", None, 0)
    broken = '{"name": "add", "parameters": {"a": 1'
    assert parse_llama3_json(broken) == (broken, None, 1)
    assert parse_llama3_json('{"x": 1}') == ('{"x": 1}', None, 1)  # JSON, but no name


def test_mistral_formats_content_ids_and_malformed() -> None:
    content, calls, bad = parse_mistral(
        'Sure. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]</s>')
    assert content == "Sure." and bad == 0 and calls is not None
    call_id = calls[0]["id"]
    assert len(call_id) == 9 and call_id.isalnum()  # what Mistral's templates accept
    # v11+ tokenizers: name[ARGS]{...} per call.
    content, calls, bad = parse_mistral(
        '[TOOL_CALLS]add[ARGS]{"a": 5, "b": 6}[TOOL_CALLS]add[ARGS]{"a": 7, "b": 8}')
    assert calls is not None and [json.loads(c["function"]["arguments"])["a"]
                                  for c in calls] == [5, 7]
    broken = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}'
    assert parse_mistral(broken) == (broken, None, 1)
    assert parse_mistral("no call") == ("no call", None, 0)


def test_parser_names_and_auto() -> None:
    assert tool_parser("auto", (DATA / "mistral-nemo.jinja").read_text()) is parse_mistral
    assert tool_parser("auto", (DATA / "smollm2.jinja").read_text()) is parse_hermes
    assert tool_parser("auto", None) is parse_hermes
    with pytest.raises(ValueError, match="llama3_json"):
        tool_parser("llama9")
    from rollart_sdk.gateway.agent import ImportedAgentOptions

    with pytest.raises(ValueError, match="unknown tool parser 'qwen'"):
        ImportedAgentOptions(run="m:f", tasks=["t"], tool_parser="qwen")
