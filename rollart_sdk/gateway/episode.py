"""One agent episode as tokens: what the gateway prompted and what the engine sampled.

Every ``/v1/chat/completions`` request of an episode is rendered with the model's chat
template (messages and tools). When its messages extend the previous request's messages
plus the reply the gateway returned, and the template's render extends the previous
prompt's text plus the generated text, the turn *continues the segment*: its context is
the previous context, the generated ids exactly as sampled, and the ids of the new text
only (never a re-tokenisation of earlier turns). Otherwise (the agent rewrote, trimmed or
summarised its history, or the template renders the reply differently from what the model
wrote) a new *segment* starts from the render of the whole request. A segment is a
trajectory as the trainer knows it: ``Turn``\\ s whose ``obs_ids`` are template tokens
(not trained) and whose ``action_ids`` are the engine's tokens (trained).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.types import GenerationResult, SamplingParams, Turn

ROLES = ("system", "developer", "user", "assistant", "tool")


class GatewayError(Exception):
    """A request the gateway refuses: ``status`` (an HTTP 4xx) and a message saying what
    is wrong and what to do (the ``openai`` client raises it as ``APIStatusError``)."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, None (an assistant turn of only tool calls)
    or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise GatewayError(400, f"{where}.content[{i}]: only text parts "
                                   "({'type': 'text', 'text': ...}) are supported", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise GatewayError(400, f"{where}.content must be a string, null or a list of text parts, "
                       f"got {type(content).__name__}", param=where)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise GatewayError(400, f"{where}: a tool call is {{'id', 'type': 'function', "
                           "'function': {'name', 'arguments'}}", param=where)
    args = fn.get("arguments", "{}")
    try:  # templates render arguments as an object (Qwen's tojson, Llama's)
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        parsed = args
    return {"id": str(call.get("id", "")), "type": "function",
            "function": {"name": fn["name"], "arguments": parsed}}


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages as the template gets them: role, text content, and tool
    calls / tool call ids where present; ``developer`` is rendered as ``system``. Raises
    :class:`GatewayError` (400) naming the bad message."""
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "messages must be a non-empty list of {'role', 'content'} "
                           "objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise GatewayError(400, f"{where}: needs a role, one of {', '.join(ROLES)}",
                               param=where)
        msg: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"],
                               "content": _text(m.get("content"), where)}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise GatewayError(400, f"{where}.tool_calls must be a list", param=where)
            msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]")
                                 for j, c in enumerate(calls)]
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def takes_string_arguments(template: str | None) -> bool:
    """Whether a chat template renders a tool call's ``arguments`` given as a JSON string
    itself (Mistral v0.3, Qwen 3 test ``arguments is string``). Others (Qwen 2.5, Llama
    3.x) ``tojson`` them, and get an object; Mistral v0.3's template HTML-escapes the
    quotes around an object, so it must get the string."""
    t = template or ""
    return "arguments is string" in t or "arguments is not string" in t


def for_template(messages: list[dict[str, Any]], string_arguments: bool) -> list[dict[str, Any]]:
    """Normalized messages as a template takes them: tool call arguments as JSON text when
    ``string_arguments``, else as the parsed object."""
    if not string_arguments:
        return messages
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [
                {**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                                   if isinstance(c["function"]["arguments"], str)
                                   else json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]]}
        out.append(m)
    return out


def _same_reply(sent: dict[str, Any], echoed: dict[str, Any]) -> bool:
    """Whether the agent sent back the reply the gateway returned (tool call ids aside)."""
    if echoed.get("role") != "assistant" or echoed.get("content", "") != sent["content"]:
        return False

    def calls(m: dict[str, Any]) -> list[Any]:
        return [(c["function"]["name"], c["function"]["arguments"])
                for c in m.get("tool_calls", [])]

    return calls(sent) == calls(echoed)


@dataclass
class Segment:
    """Turns that share one growing context (one trained sample)."""

    turns: list[Turn] = field(default_factory=list)
    context: list[int] = field(default_factory=list)  # prompt + sampled ids so far
    # The last request's messages (None: a raw /v1/completions prompt).
    messages: list[dict[str, Any]] | None = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)  # the reply returned to them
    text: str = ""  # the last prompt's render (text), then the generated text
    generated_text: str = ""
    # Set while the last request that recorded into it had several choices (n > 1): a
    # branch, followed only once a later request extends it (EpisodeRecord.earlier).
    branch: bool = False

    @property
    def generated_tokens(self) -> int:
        return sum(len(t.action_ids) for t in self.turns)


# (messages, tools) -> text; also called with template_kwargs= (a request's chat_template_kwargs)
Render = Callable[..., str]
Generate = Callable[[list[int], SamplingParams], Awaitable[GenerationResult]]


@dataclass
class Prompt:
    """A request's context: the ids to send, and where they came from."""

    ids: list[int]
    new_ids: list[int]  # the tokens this request adds (the turn's obs_ids)
    text: str  # the template's render of the request's messages (or the raw prompt)
    segment: int | None = None  # the segment it extends (None: a new one)
    forced: str = ""  # text the gateway appended after the render (tool_choice), in ``text``
    forced_ids: list[int] = field(default_factory=list)  # its ids: the end of ``ids``

    @property
    def continues(self) -> bool:
        return self.segment is not None


@dataclass
class Choice:
    """One sampled answer to a request: the engine's result (cut at a stop sequence) and
    the message returned for it (None on ``/v1/completions``)."""

    result: GenerationResult
    reply: dict[str, Any] | None = None
    stopped: str | None = None  # the text before the stop sequence that ended it


class EpisodeRecord:
    """The token record of one episode: segments of turns, built request by request.

    ``render(messages, tools)`` is the chat template's text with the generation prompt
    (with ``template_kwargs=`` when a request sends ``chat_template_kwargs``);
    ``encode(text)`` its ids (no special tokens added: templates write their own);
    ``decode(ids)`` the text of ids, special tokens kept; ``render_turn(messages, tools)``
    the template's text without the generation prompt (for the tool-call opener that
    ``tool_choice`` forces, :mod:`~rollart_sdk.gateway.forcing`; None: not available).

    A request with ``n > 1`` records each choice on its own branch: choice 0 extends the
    segment, choice ``i`` a copy of it (the earlier turns, the same ``Turn`` objects, then
    its own). A later request extends whichever branch it sends back; that branch is
    followed, its siblings are not (:meth:`earlier`, :meth:`untrained`)."""

    def __init__(self, render: Render, encode: Callable[[str], list[int]],
                 decode: Callable[[list[int]], str], render_turn: Render | None = None) -> None:
        self.render = render
        self.render_turn = render_turn
        self.encode = encode
        self.decode = decode
        self.segments: list[Segment] = []
        self.last: list[int] = []  # the segments of the last request's choices

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[Any] | None,
                      template_kwargs: dict[str, Any] | None = None) -> str:
        """The template's render of a request (generation prompt on), or a 400;
        ``template_kwargs``: the request's ``chat_template_kwargs`` (over the task's)."""
        try:
            if template_kwargs:
                return self.render(messages, tools, template_kwargs=template_kwargs)
            return self.render(messages, tools)
        except Exception as exc:  # noqa: BLE001 - a template's raise_exception, a bad tool
            raise GatewayError(400, f"the model's chat template cannot render these messages "
                               f"and tools: {type(exc).__name__}: {exc}", param="messages") from None

    def prompt(self, messages: list[dict[str, Any]], tools: list[Any] | None,
               forced: str = "", text: str | None = None) -> Prompt:
        """The context of a chat request with these (normalized) messages (``text``: their
        render, when already made); ``forced`` is text the gateway appends after the
        render (the opening of a tool call ``tool_choice`` asks for), tokenised on its own
        so that the render's tokens are the same as without it."""
        if text is None:
            text = self.render_prompt(messages, tools)
        extra = self.encode(forced) if forced else []
        for i in range(len(self.segments) - 1, -1, -1):
            seg = self.segments[i]
            if self._extends(seg, messages, text):
                new = self.encode(text[len(seg.text):]) + extra
                return Prompt(seg.context + new, new, text + forced, i, forced, extra)
        ids = self.encode(text) + extra
        return Prompt(ids, ids, text + forced, None, forced, extra)

    def prompt_raw(self, text: str | None, ids: list[int] | None) -> Prompt:
        """The context of a ``/v1/completions`` prompt, given as text or as ids. It extends
        a segment when it starts with that segment's prompt and generated tokens (ids), or
        their text; only the rest is tokenised."""
        for i in range(len(self.segments) - 1, -1, -1):
            seg = self.segments[i]
            if seg.messages is not None or not seg.context:
                continue  # a chat segment continues with chat requests
            if ids is not None and len(ids) > len(seg.context) \
                    and ids[:len(seg.context)] == seg.context:
                new = ids[len(seg.context):]
                return Prompt(list(ids), new, seg.text + self.decode(new), i)
            if text is not None and len(text) > len(seg.text) and text.startswith(seg.text):
                new = self.encode(text[len(seg.text):])
                return Prompt(seg.context + new, new, text, i)
        if ids is None:
            ids = self.encode(text or "")
        return Prompt(list(ids), list(ids), text if text is not None else self.decode(ids))

    def _extends(self, seg: Segment, messages: list[dict[str, Any]], text: str) -> bool:
        if seg.messages is None:
            return False
        n = len(seg.messages)
        return (len(messages) > n + 1 and messages[:n] == seg.messages
                and _same_reply(seg.reply, messages[n]) and text.startswith(seg.text))

    def record(self, prompt: Prompt, messages: list[dict[str, Any]] | None,
               choices: list[Choice]) -> list[Segment]:
        """Add the turn(s) the engine answered, one branch per choice; ``messages`` is None
        for a raw prompt."""
        # The turns before this request (a copy: choice 0 extends the segment in place,
        # and the other choices must not see its turn).
        base = list(self.segments[prompt.segment].turns) if prompt.segment is not None else []
        out: list[Segment] = []
        self.last = []
        for i, choice in enumerate(choices):
            if i == 0 and prompt.segment is not None:
                seg, index = self.segments[prompt.segment], prompt.segment
            else:
                seg, index = Segment(turns=list(base)), len(self.segments)
                self.segments.append(seg)
            self._add(seg, prompt, messages, choice)
            seg.branch = len(choices) > 1
            self.last.append(index)
            out.append(seg)
        return out

    def _add(self, seg: Segment, prompt: Prompt, messages: list[dict[str, Any]] | None,
             choice: Choice) -> None:
        result, reply = choice.result, choice.reply or {}
        generated = self.decode(result.token_ids)
        text = reply.get("content") if choice.reply is not None else generated
        seg.turns.append(Turn(obs_ids=list(prompt.new_ids), action_ids=list(result.token_ids),
                              logprobs=list(result.logprobs), versions=list(result.versions),
                              action_text=text or ""))
        seg.context = prompt.ids + list(result.token_ids)
        seg.messages = messages
        seg.reply = reply
        seg.text = prompt.text + generated
        seg.generated_text = generated

    def trained(self, answer: str | None = None) -> tuple[Segment | None, bool]:
        """The last segment to train: the one the last request extended or started. When
        that request had several choices, the branch whose returned text is ``answer`` (the
        agent's final answer), else choice 0; the flag says the choice was a guess."""
        if not self.last:
            return None, False
        if len(self.last) == 1:
            return self.segments[self.last[0]], False
        for index in self.last:
            seg = self.segments[index]
            if answer is not None and seg.turns[-1].action_text.strip() == answer.strip():
                return seg, False
        return self.segments[self.last[0]], True

    def earlier(self, last: Segment) -> list[list[Turn]]:
        """The turns of each segment trained before ``last`` (each its own sample), in
        the order the segments started: every segment the agent followed, that is every
        one but the branches (choices of a request with ``n > 1``) that no later request
        extended. A branch copies its segment's turns (the same ``Turn`` objects); a turn
        that ``last`` or an earlier sample already trains is context here (its tokens
        kept, none trained), and a segment with nothing left to train is left out, so no
        token is trained twice."""
        seen = {id(t) for t in last.turns}
        out: list[list[Turn]] = []
        for seg in self.segments:
            if seg is last or seg.branch or not seg.turns:
                continue
            turns = [_as_context(t) if id(t) in seen else t for t in seg.turns]
            seen.update(id(t) for t in seg.turns)
            if any(t.action_ids for t in turns):
                out.append(turns)
        return out

    def untrained(self, last: Segment) -> int:
        """Branches not trained: choices of a request with ``n > 1`` that no later
        request extended, other than ``last`` (the agent did not follow them)."""
        return sum(1 for seg in self.segments if seg.branch and seg is not last)


def _as_context(turn: Turn) -> Turn:
    """``turn`` as context only: its prompt and sampled tokens, nothing to train."""
    return Turn(obs_ids=list(turn.obs_ids) + list(turn.action_ids), action_ids=[],
                logprobs=[], versions=[], action_text="")
