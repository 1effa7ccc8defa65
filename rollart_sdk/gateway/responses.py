"""OpenAI response bodies of the gateway: chat completions, text completions, their
server-sent chunks. Pure functions of what was generated and recorded."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from rollart_sdk.gateway.episode import Choice, GatewayError, Prompt

Decode = Callable[[list[int]], str]


def _finish(choice: Choice) -> str:
    if choice.reply is not None and choice.reply.get("tool_calls"):
        return "tool_calls"
    if choice.stopped is None and choice.result.finish_reason == "length":
        return "length"
    return "stop"


def _usage(prompt: Prompt, choices: list[Choice]) -> dict[str, int]:
    n = sum(len(c.result.token_ids) for c in choices)
    return {"prompt_tokens": len(prompt.ids), "completion_tokens": n,
            "total_tokens": len(prompt.ids) + n}


def chat_response(model: str, prompt: Prompt, choices: list[Choice], decode_text: Decode,
                  decode: Decode, logprobs: bool) -> dict[str, Any]:
    """A ``chat.completion``: one choice per sampled answer, log-probs when asked."""
    out = []
    for i, c in enumerate(choices):
        reply = c.reply or {}
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or None}
        if reply.get("tool_calls"):
            message["tool_calls"] = reply["tool_calls"]
        elif message["content"] is None:
            message["content"] = ""
        lp = None
        if logprobs:
            lp = {"content": [{"token": t, "logprob": v, "bytes": list(t.encode()),
                               "top_logprobs": []}
                              for t, v in zip((decode([x]) for x in c.result.token_ids),
                                              c.result.logprobs, strict=True)]}
        out.append({"index": i, "message": message, "finish_reason": _finish(c),
                    "logprobs": lp})
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": out,
            "usage": _usage(prompt, choices)}


def completion_prompt(prompt: Any) -> tuple[str | None, list[int] | None]:
    """``/v1/completions``' ``prompt``: a string, a list of token ids, or a list holding
    one of those (one prompt per request). Returns ``(text, None)`` or ``(None, ids)``."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt, None
    if (isinstance(prompt, list) and prompt
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in prompt)):
        return None, list(prompt)
    raise GatewayError(400, "prompt must be a non-empty string or a non-empty list of token "
                       "ids (one prompt per request: send a batch as separate requests)",
                       param="prompt")


def text_response(model: str, prompt: Prompt, choices: list[Choice], decode_text: Decode,
                  decode: Decode, logprobs: bool) -> dict[str, Any]:
    """A ``text_completion``: the generated text (cut before a stop sequence)."""
    out = []
    for i, c in enumerate(choices):
        ids = c.result.token_ids
        text = c.stopped if c.stopped is not None else decode_text(ids)
        lp = None
        if logprobs:
            tokens = [decode([x]) for x in ids]
            offsets, at = [], 0
            for t in tokens:
                offsets.append(at)
                at += len(t)
            lp = {"tokens": tokens, "token_logprobs": list(c.result.logprobs),
                  "top_logprobs": None, "text_offset": offsets}
        out.append({"index": i, "text": text, "finish_reason": _finish(c), "logprobs": lp})
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": out,
            "usage": _usage(prompt, choices)}


def _head(answer: dict[str, Any], obj: str) -> dict[str, Any]:
    return {"id": answer["id"], "created": answer["created"], "model": answer["model"],
            "object": obj}


def chat_chunks(answer: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A finished chat answer as ``chat.completion.chunk`` events: each choice's whole
    message in one delta, then its finish reason (and usage when asked). The gateway
    answers once the turn is generated: streaming here is the protocol, not token pacing."""
    head = _head(answer, "chat.completion.chunk")
    chunks = []
    for choice in answer["choices"]:
        i, message = choice["index"], choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
        if "tool_calls" in message:
            delta["tool_calls"] = [{"index": j, **c}
                                   for j, c in enumerate(message["tool_calls"])]
        chunks.append({**head, "choices": [{"index": i, "delta": delta, "finish_reason": None,
                                            "logprobs": choice["logprobs"]}]})
        chunks.append({**head, "choices": [{"index": i, "delta": {},
                                            "finish_reason": choice["finish_reason"]}]})
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    return chunks


def text_chunks(answer: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A finished text completion as ``text_completion`` events (one per choice)."""
    head = _head(answer, "text_completion")
    chunks = [{**head, "choices": [c]} for c in answer["choices"]]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    return chunks


def sse(chunks: list[dict[str, Any]]) -> Any:
    from starlette.responses import StreamingResponse

    events = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return StreamingResponse(iter(events), media_type="text/event-stream")
