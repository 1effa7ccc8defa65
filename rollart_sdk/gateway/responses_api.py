"""OpenAI's Responses API (``POST /v1/responses``) over the gateway's chat turn.

The OpenAI Agents SDK's default model (``OpenAIResponsesModel``, what
``OpenAIProvider`` gives) and ``client.responses.create`` speak this API; vLLM and SGLang
serve it too. A request is translated into the chat request the gateway already serves
(:func:`chat_request`): ``instructions`` becomes the system message, the ``input`` items
messages (``message`` items, ``function_call`` items as the assistant's tool calls,
``function_call_output`` items as tool messages), function ``tools`` the chat tool
definitions, ``max_output_tokens`` the token limit. The turn is then rendered, sampled
and recorded exactly as a chat turn (the same segment rules, the same sampling checks),
and its answer becomes a ``response`` object (:func:`response_object`): an ``output`` of
a ``message`` item (the text) and one ``function_call`` item per tool call; streamed, the
same as the API's typed events (:func:`stream_events`), all at once when the turn is done.

``previous_response_id`` continues a response of the same episode (the gateway keeps each
episode's conversations while it runs; ``instructions`` are not carried over, as in
OpenAI's API). What the gateway cannot honour is refused with a 400 naming the field:
hosted tools (web search, file search, code interpreter, MCP, ...), constrained output
(``text.format`` json_schema / json_object), ``reasoning`` options, ``conversation``,
stored ``prompt`` templates, ``background``, non-text input parts, ``reasoning`` and
``item_reference`` input items, ``top_logprobs`` above 0.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rollart_sdk.gateway.episode import GatewayError
from rollart_sdk.gateway.params import text_only

# Fields a chat request takes as they are (the engines' extensions among them, sent
# through the client's ``extra_body``; the chat path checks them).
_PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed",
           "stop", "presence_penalty", "frequency_penalty", "logit_bias",
           "chat_template_kwargs", "guided_json", "guided_regex", "guided_choice",
           "guided_grammar", "structured_outputs", "regex", "json_schema", "ebnf")
# Refused when set (not None): what each would need that the gateway does not do.
_REFUSED = {
    "conversation": "conversations are not stored by the rollart gateway; send the "
                    "history as input (or previous_response_id within the episode)",
    "prompt": "stored prompt templates are not served; send instructions and input",
    "background": "background responses are not served; await the response",
    "reasoning": "reasoning options are not served (the engines sample the task's policy); "
                 "a template switch such as Qwen 3's thinking goes in the task's "
                 "chat_template_kwargs (or the request's extra_body chat_template_kwargs)",
    "context_management": "server-side context compaction is not served; trim the input "
                          "in the agent",
    "max_tool_calls": "max_tool_calls is not enforced by the rollart gateway; limit tool "
                      "calls in the agent",
}
# ``include`` values: the output text's log-probs are returned; the others name items
# the gateway never produces (reasoning, hosted tool results), so they ask for nothing.
LOGPROBS = "message.output_text.logprobs"
_INCLUDABLE = frozenset({
    LOGPROBS, "reasoning.encrypted_content", "file_search_call.results",
    "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url",
    "code_interpreter_call.outputs"})
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")


def _where(i: int) -> str:
    return f"input[{i}]"


def _content(content: Any, where: str) -> str:
    """An input message's content as text: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise GatewayError(400, f"{where}.content must be a string or a list of content "
                           f"parts, got {type(content).__name__}", param=where)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        else:
            raise GatewayError(400, f"{where}.content[{j}]: only text parts (input_text, "
                               f"output_text) are served by the rollart gateway, got "
                               f"{kind!r}; the policy is a text model", param=where)
    return "".join(parts)


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` (a string or a list of items) as chat messages, or a 400 naming the
    item. A ``function_call`` item joins the assistant message just before it (one turn's
    output is a message and its calls) or starts one of its own."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise GatewayError(400, "input must be a string or a list of input items",
                           param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = _where(i)
        if not isinstance(item, dict):
            raise GatewayError(400, f"{where} must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise GatewayError(400, f"{where}: a message's role is user, system, "
                                   f"developer or assistant, got {role!r}", param=where)
            out.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise GatewayError(400, f"{where}: a function_call item needs name and "
                                   "call_id", param=where)
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": item.get("arguments", "{}")}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise GatewayError(400, f"{where}: a function_call_output item needs the "
                                   "call_id of its function_call", param=where)
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise GatewayError(400, f"{where}: input items of type {kind!r} are not served "
                               "by the rollart gateway (message, function_call and "
                               "function_call_output are)", param=where)
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools (``{type, name, description, parameters}``) as chat tool
    definitions; a hosted tool is a 400."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise GatewayError(400, "tools must be a list of tool definitions", param="tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function" or not isinstance(tool.get("name"), str):
            raise GatewayError(400, f"tools[{i}]: only function tools ({{'type': 'function', "
                               f"'name', 'parameters'}}) are served by the rollart gateway, "
                               f"got {kind!r}: hosted tools run on OpenAI's servers; give "
                               "the agent a function that does the same", param="tools")
        fn = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" \
            and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise GatewayError(400, "tool_choice must be 'auto', 'none', 'required' or {'type': "
                       f"'function', 'name': NAME}}, got {value!r}", param="tool_choice")


def _text_format(text: Any) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise GatewayError(400, "text must be an object ({'format': {'type': 'text'}})",
                           param="text")
    text_only(text.get("format"), "text.format")
    if text.get("verbosity") is not None:
        raise GatewayError(400, "text.verbosity is not served by the rollart gateway (the "
                           "engines sample the task's policy); ask for brevity in the "
                           "instructions", param="text.verbosity")


def _check_fields(body: dict[str, Any]) -> None:
    """A 400 naming the first field of ``body`` the gateway cannot honour or that is
    malformed (the fields besides input, instructions and tools)."""
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, False):
            raise GatewayError(400, f"{key}: {why}", param=key)
    _text_format(body.get("text"))
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise GatewayError(400, "include must be a list of strings", param="include")
    unknown = sorted(set(include) - _INCLUDABLE)
    if unknown:
        raise GatewayError(400, f"include {unknown} is not served by the rollart gateway "
                           f"(it returns {LOGPROBS})", param="include")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise GatewayError(400, f"top_logprobs={top!r}: the rollart gateway returns the "
                           "sampled token's log-prob only; leave top_logprobs unset",
                           param="top_logprobs")
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise GatewayError(400, f"truncation must be 'auto' or 'disabled', got "
                           f"{body['truncation']!r}", param="truncation")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise GatewayError(400, "metadata must be an object of strings", param="metadata")


def chat_request(body: dict[str, Any], previous: list[dict[str, Any]] | None
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(the chat request, its conversation without the instructions)`` of a Responses
    request; ``previous`` is the conversation of ``previous_response_id`` (None: none)."""
    _check_fields(body)
    if "input" not in body:
        raise GatewayError(400, "input is required (a string or a list of input items)",
                           param="input")
    conversation = [*(previous or []), *input_messages(body["input"])]
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise GatewayError(400, "instructions must be a string", param="instructions")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) \
        + conversation
    chat: dict[str, Any] = {k: body[k] for k in _PASSED if k in body}
    chat["messages"] = messages
    if (tools := chat_tools(body.get("tools"))) is not None:
        chat["tools"] = tools
    if (choice := _tool_choice(body.get("tool_choice"))) is not None:
        chat["tool_choice"] = choice
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if LOGPROBS in (body.get("include") or []):
        chat["logprobs"] = True
    return chat, conversation


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _function_tools(tools: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "name": t["name"], "description": t.get("description"),
             "parameters": t.get("parameters"), "strict": t.get("strict")}
            for t in tools or []]


def response_object(body: dict[str, Any], answer: dict[str, Any], response_id: str
                    ) -> dict[str, Any]:
    """The ``response`` of a chat answer (its one choice): a ``message`` item with the
    text (when there is any), a ``function_call`` item per tool call."""
    choice = answer["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        logprobs = [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"],
                     "top_logprobs": []}
                    for t in (choice.get("logprobs") or {}).get("content") or []]
        output.append({"type": "message", "id": _id("msg"), "status": "completed",
                       "role": "assistant", "content": [
                           {"type": "output_text", "text": message["content"],
                            "annotations": [], "logprobs": logprobs}]})
    for call in message.get("tool_calls") or []:
        args = call["function"]["arguments"]
        output.append({"type": "function_call", "id": _id("fc"), "call_id": call["id"],
                       "name": call["function"]["name"], "status": "completed",
                       "arguments": args if isinstance(args, str) else json.dumps(args)})
    usage = answer["usage"]
    cut = choice["finish_reason"] == "length"
    return {
        "id": response_id, "object": "response", "created_at": float(answer["created"]),
        "status": "incomplete" if cut else "completed", "model": answer["model"],
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": _function_tools(body.get("tools")),
        "text": {"format": {"type": "text"}}, "truncation": body.get("truncation") or "disabled",
        "store": body.get("store", True), "background": False, "reasoning": None,
        "usage": {"input_tokens": usage["prompt_tokens"],
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": usage["completion_tokens"],
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage["total_tokens"]},
    }


def reply_message(response: dict[str, Any]) -> dict[str, Any]:
    """The response's output as the assistant message a later request continues from."""
    text = "".join(p["text"] for item in response["output"] if item["type"] == "message"
                   for p in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in response["output"] if item["type"] == "function_call"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def stream_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished response as the API's stream events (``response.created`` ... one
    delta per item ... ``response.completed``), numbered; the gateway answers once the
    turn is generated, so this is the protocol, not token pacing."""
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    start = {**response, "status": "in_progress", "output": [], "usage": None,
             "incomplete_details": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for i, item in enumerate(response["output"]):
        if item["type"] == "message":
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "content": []})
            for j, part in enumerate(item["content"]):
                at = {"item_id": item["id"], "output_index": i, "content_index": j}
                emit("response.content_part.added", **at,
                     part={**part, "text": "", "logprobs": []})
                emit("response.output_text.delta", **at, delta=part["text"],
                     logprobs=part["logprobs"])
                emit("response.output_text.done", **at, text=part["text"],
                     logprobs=part["logprobs"])
                emit("response.content_part.done", **at, part=part)
        else:
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "arguments": ""})
            at = {"item_id": item["id"], "output_index": i}
            emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
            emit("response.function_call_arguments.done", **at, name=item["name"],
                 arguments=item["arguments"])
        emit("response.output_item.done", output_index=i, item=item)
    emit(f"response.{response['status']}", response=response)
    return events


def sse_events(events: list[dict[str, Any]]) -> Any:
    """Server-sent events with the event's type on its ``event:`` line, as the API sends."""
    from starlette.responses import StreamingResponse

    lines = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]
    return StreamingResponse(iter(lines), media_type="text/event-stream")
