"""The OpenAI-compatible HTTP gateway: ``/v1/chat/completions``, ``/v1/responses``
(:mod:`~rollart_sdk.gateway.responses_api`), ``/v1/completions`` and ``/v1/models``.

Served by Starlette on uvicorn, on the control plane's event loop (where the LLMProxy
lives), bound to 127.0.0.1. Each episode is opened by its EnvManager
(:class:`~rollart_sdk.control.agent_manager.AgentManager`) with the function that sends a
turn to the engines through the LLMProxy; the gateway hands the agent a base URL naming
the episode and a bearer token that is the episode's alone. Every request is attributed to
one episode, rendered with the chat template and recorded token by token
(:mod:`rollart_sdk.gateway.episode`).

Refusals are OpenAI-style error bodies with a 4xx status the ``openai`` client raises:
401 (no or unknown token), 403 (another episode's token), 404 (unknown model or route),
410 (the episode ended: aborted for staleness, a dead engine, its time), 413 (body over
the limit), 400 (malformed JSON or fields, a sampling field that would change the
trained policy (:mod:`~rollart_sdk.gateway.params`), context full, too many turns).
Response bodies: :mod:`~rollart_sdk.gateway.responses`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.gateway.episode import (
    Choice,
    EpisodeRecord,
    GatewayError,
    Prompt,
    normalize_messages,
)
from rollart_sdk.gateway.forcing import (
    OPENERS,
    ToolChoice,
    forced_text,
    parse_tool_choice,
    parser_name,
    template_opener,
)
from rollart_sdk.gateway.params import (
    chat_template_kwargs,
    choice_sampling,
    cut_at_stop,
    request_params,
)
from rollart_sdk.gateway.responses import (
    chat_chunks,
    chat_response,
    completion_prompt,
    sse,
    text_chunks,
    text_response,
)
from rollart_sdk.gateway.responses_api import (
    chat_request,
    reply_message,
    response_object,
    sse_events,
    stream_events,
)
from rollart_sdk.gateway.tools import ToolParser, parse_hermes, parse_none
from rollart_sdk.types import GenerationResult, SamplingParams

MAX_BODY_BYTES = 4 * 2**20  # a request body over this is refused (413)
MODEL_NAME = "policy"  # the served model's id (the policy being trained)


# What an episode's end means, for the agent's error message.
_WHY = {"aborted:stale": "its trajectory fell behind the run's staleness bound "
                         "(rollout.alpha) and is dropped",
        "aborted:run_end": "the run is ending", "aborted:engine": "its engine failed",
        "aborted:surplus": "its batch was already full"}


def _ended(episode_id: str, reason: str) -> str:
    why = _WHY.get(reason)
    return f"episode {episode_id} has ended ({reason}{': ' + why if why else ''})"


class EpisodeEnded(Exception):
    """The episode's trajectory ended (aborted, or closed): its requests get 410."""


@dataclass
class Episode:
    """One agent episode the gateway serves."""

    episode_id: str
    token: str
    record: EpisodeRecord
    generate: Callable[[list[int], SamplingParams], Awaitable[GenerationResult]]
    sampling: SamplingParams
    max_turns: int
    max_context_tokens: int
    stop_ids: set[int]
    decode_text: Callable[[list[int]], str]  # special tokens skipped
    tool_parser: ToolParser = parse_hermes
    # A request's temperature / top_p must be the task's (the trainer learns that policy);
    # False in an evaluation: they are ignored and the eval's sampling applies.
    strict_sampling: bool = True
    base_url: str = ""
    ended: str | None = None  # why it takes no more requests
    requests: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # refusals, malformed tool calls
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # /v1/responses: each response's conversation (without its instructions), for a later
    # request's previous_response_id; kept while the episode runs (at most max_turns).
    conversations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _error(status: int, message: str, code: str = "invalid_request_error",
           param: str | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": code, "param": param,
                                   "code": code}}, status_code=status)


class Gateway:
    """Episodes by token, and the HTTP server that serves them."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = MAX_BODY_BYTES, model_name: str = MODEL_NAME) -> None:
        self.host, self.port = host, port
        self.max_body_bytes = max_body_bytes
        self.model_name = model_name
        self.episodes: dict[str, Episode] = {}
        self._by_token: dict[str, Episode] = {}
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self.refused: Counter[str] = Counter()  # HTTP refusals by status, all episodes

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Serve on this event loop (idempotent; restarted on a new loop)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        import uvicorn

        sock = socket.socket()
        # Accepted connections inherit it: without, a response written in two parts
        # (head, body) waits ~40 ms for the client's delayed ACK (Nagle).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False,
                                lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the run owns its signals
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None and not self._task.done():
            self._server.should_exit = True
            await asyncio.wait_for(self._task, 10)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ episodes
    def open(self, episode_id: str, **kwargs: Any) -> Episode:
        """Register an episode (``Episode``'s fields but id and token); its
        ``base_url`` and ``token`` are what the agent is handed."""
        if episode_id in self.episodes:
            raise ValueError(f"episode {episode_id!r} is already open")
        ep = Episode(episode_id=episode_id, token=f"rk-{secrets.token_urlsafe(24)}", **kwargs)
        ep.base_url = f"{self.url}/e/{episode_id}/v1"
        self.episodes[episode_id] = ep
        self._by_token[ep.token] = ep
        return ep

    def close(self, episode_id: str, reason: str = "closed") -> Episode | None:
        """Stop serving an episode; its later requests get 410 with ``reason``."""
        ep = self.episodes.pop(episode_id, None)
        if ep is not None:
            ep.ended = ep.ended or reason
            self._by_token.pop(ep.token, None)
        return ep

    # ------------------------------------------------------------------ HTTP
    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(routes=[
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/e/{episode}/v1/models", self._models, methods=["GET"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/e/{episode}/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/e/{episode}/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/e/{episode}/v1/completions", self._completions, methods=["POST"]),
        ])

    def _episode(self, request: Any) -> Episode:
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not token:
            raise GatewayError(401, "no API key: send the episode's token as the bearer "
                               "token (openai.AsyncOpenAI(api_key=TOKEN))", "invalid_api_key")
        ep = self._by_token.get(token)
        named = request.path_params.get("episode")
        if ep is None:
            raise GatewayError(401, "unknown or expired API key: an episode's token is valid "
                               "while its episode runs", "invalid_api_key")
        if named is not None and named != ep.episode_id:
            raise GatewayError(403, f"this token does not belong to episode {named!r}: use "
                               "the base URL and token handed out together", "permission_denied")
        return ep

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        try:
            self._episode(request)
        except GatewayError as exc:
            return self._refuse(exc)
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "rollart"}]})

    def _refuse(self, exc: GatewayError) -> Any:
        self.refused[str(exc.status)] += 1
        return _error(exc.status, exc.message, exc.code, exc.param)

    async def _body(self, request: Any) -> dict[str, Any]:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise GatewayError(413, f"request body of {length} bytes is over the gateway's "
                               f"limit of {self.max_body_bytes}", "request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise GatewayError(413, f"request body is over the gateway's limit of "
                                   f"{self.max_body_bytes} bytes", "request_too_large")
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except ValueError as exc:
            raise GatewayError(400, f"the body is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "the body must be a JSON object")
        return body

    async def _chat(self, request: Any) -> Any:
        return await self._serve(request, self.complete, _chunked(chat_chunks))

    async def _completions(self, request: Any) -> Any:
        return await self._serve(request, self.complete_text, _chunked(text_chunks))

    async def _responses(self, request: Any) -> Any:
        return await self._serve(request, self.respond,
                                 lambda response, body: sse_events(stream_events(response)))

    async def _serve(self, request: Any, complete: Callable[..., Awaitable[dict[str, Any]]],
                     stream: Callable[[dict[str, Any], dict[str, Any]], Any]) -> Any:
        from starlette.responses import JSONResponse

        ep: Episode | None = None
        try:
            ep = self._episode(request)
            body = await self._body(request)
            answer = await complete(ep, body)
            if body.get("stream"):
                return stream(answer, body)
            return JSONResponse(answer)
        except GatewayError as exc:
            if ep is not None:
                ep.counts[f"refused_{exc.status}"] += 1
            return self._refuse(exc)

    # ------------------------------------------------------------------ completion
    def _check(self, ep: Episode, body: dict[str, Any]) -> None:
        if ep.ended is not None:
            raise GatewayError(410, f"{_ended(ep.episode_id, ep.ended)}; its trajectory "
                               "takes no more requests", "episode_ended")
        if body.get("model") != self.model_name:
            raise GatewayError(404, f"model {body.get('model')!r} is not served here; the "
                               f"trained policy is {self.model_name!r}", "model_not_found",
                               "model")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise GatewayError(400, "tools must be a list of tool definitions", param="tools")
        if ep.requests >= ep.max_turns:
            raise GatewayError(400, f"episode {ep.episode_id} made its {ep.max_turns} requests "
                               "(tasks[].max_turns); raise max_turns for longer agents",
                               "max_turns_exceeded")

    async def complete(self, ep: Episode, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion of ``ep``: render, generate (``n`` choices), record, answer."""
        self._check(ep, body)
        messages = normalize_messages(body.get("messages"))
        tools = body.get("tools") or None
        choice = parse_tool_choice(body, tools)
        template_kwargs = chat_template_kwargs(body)
        async with ep.lock:  # one turn at a time: each continues the one before
            self._check(ep, body)
            text = ep.record.render_prompt(messages, tools, template_kwargs)
            forced = self._forced(ep, choice, messages, tools, text, template_kwargs)
            prompt = ep.record.prompt(messages, tools, forced, text)
            choices = await self._generate(ep, body, prompt)
            if forced:
                ep.counts["forced_tool_choice"] += 1
                ep.counts["forced_prefix_tokens"] += len(prompt.forced_ids)
            for c in choices:
                c.reply = self._reply(ep, c, prompt, choice)
            # Kept as the agent will send it back (tool call arguments parsed).
            ep.record.record(prompt, messages, [
                Choice(c.result, normalize_messages([c.reply])[0]) for c in choices])
        return chat_response(self.model_name, prompt, choices, ep.decode_text,
                             ep.record.decode, bool(body.get("logprobs")))

    async def respond(self, ep: Episode, body: dict[str, Any]) -> dict[str, Any]:
        """One ``/v1/responses`` request: translated into a chat turn, served as one
        (:meth:`complete`), answered as a ``response`` (:mod:`.responses_api`)."""
        previous = None
        prev_id = body.get("previous_response_id")
        if prev_id is not None:
            previous = ep.conversations.get(prev_id) if isinstance(prev_id, str) else None
            if previous is None:
                raise GatewayError(400, f"previous response {prev_id!r} is not one of this "
                                   "episode's responses (the gateway keeps an episode's "
                                   "responses while it runs)", "previous_response_not_found",
                                   "previous_response_id")
        chat, conversation = chat_request(body, previous)
        answer = await self.complete(ep, chat)
        if previous is not None:
            ep.counts["responses_chained"] += 1
        response = response_object(body, answer, f"resp_{secrets.token_hex(16)}")
        ep.conversations[response["id"]] = [*conversation, reply_message(response)]
        return response

    async def complete_text(self, ep: Episode, body: dict[str, Any]) -> dict[str, Any]:
        """One ``/v1/completions`` request: the prompt as text or token ids, recorded like
        a chat turn (it continues a segment when it extends that segment's tokens)."""
        self._check(ep, body)
        text, ids = completion_prompt(body.get("prompt"))
        logprobs = body.get("logprobs")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= 5):
            raise GatewayError(400, f"logprobs must be an integer 0..5, got {logprobs!r}",
                               param="logprobs")
        async with ep.lock:
            self._check(ep, body)
            prompt = ep.record.prompt_raw(text, ids)
            choices = await self._generate(ep, body, prompt)
            ep.record.record(prompt, None, choices)
        return text_response(self.model_name, prompt, choices, ep.decode_text,
                             ep.record.decode, logprobs is not None)

    async def _generate(self, ep: Episode, body: dict[str, Any], prompt: Any) -> list[Choice]:
        """The request's ``n`` choices from the engine (one after another: each is a turn
        of the trajectory, prefix-cached on its engine), cut at the stop sequences."""
        if len(prompt.ids) >= ep.max_context_tokens:
            raise GatewayError(400, f"the prompt has {len(prompt.ids)} tokens, the task's "
                               f"context is {ep.max_context_tokens} (tasks[]."
                               "max_context_tokens)", "context_length_exceeded", "messages")
        params = request_params(body, ep.sampling, ep.sampling.seed or 0, ep.requests,
                                strict=ep.strict_sampling)
        ep.requests += 1
        choices = []
        for i in range(params.n):
            try:
                result = await ep.generate(prompt.ids, choice_sampling(params, i))
            except EpisodeEnded as exc:
                ep.ended = ep.ended or str(exc)
                raise GatewayError(410, f"{_ended(ep.episode_id, str(exc))}; this request "
                                   "was not completed", "episode_ended") from None
            cut, before = cut_at_stop(result, ep.decode_text, params.stop)
            if before is not None:
                ep.counts["stopped_at_stop_sequence"] += 1
            choices.append(Choice(cut, None, before))
        if params.n > 1:
            ep.counts["choices_n_gt_1"] += params.n
        return choices

    def _forced(self, ep: Episode, choice: ToolChoice, messages: list[dict[str, Any]],
                tools: list[Any] | None, text: str,
                template_kwargs: dict[str, Any] | None = None) -> str:
        """The opening of a tool call that ``tool_choice`` forces, appended to the prompt
        (:mod:`~rollart_sdk.gateway.forcing`); "" when nothing is forced."""
        if not choice.forces:
            return ""
        name = parser_name(ep.tool_parser)
        if name not in OPENERS:
            raise GatewayError(400, f"tool_choice {choice.mode!r} needs a tool parser that "
                               f"knows the model's call format; this task's is "
                               f"{name or 'a custom function'!r} (set tool_parser to hermes, "
                               "llama3_json or mistral)", param="tool_choice")
        assert name is not None
        opener = None
        render_turn = ep.record.render_turn
        if render_turn is not None:
            if template_kwargs:
                render_turn = functools.partial(render_turn, template_kwargs=template_kwargs)
            opener = template_opener(render_turn, text, messages, tools, name)
        if opener is None:  # the template does not write calls the parser reads
            ep.counts["forced_opener_from_parser"] += 1
            opener = OPENERS[name]
        return forced_text(choice, opener, tools)

    def _reply(self, ep: Episode, choice: Choice, prompt: Prompt | None = None,
               tool_choice: ToolChoice | None = None) -> dict[str, Any]:
        """The assistant message of a choice: the tool parser reads the generated text
        with special tokens kept (Llama's ``<|python_tag|>``, Mistral's ``[TOOL_CALLS]``),
        after the text the gateway forced (``tool_choice``); without a call the content is
        that text with special tokens skipped. ``tool_choice: "none"``: no parsing."""
        ids = list(choice.result.token_ids)
        while ids and ids[-1] in ep.stop_ids:
            ids.pop()
        forced, forced_ids = (prompt.forced, prompt.forced_ids) if prompt else ("", [])
        parse = parse_none if tool_choice is not None and tool_choice.mode == "none" \
            else ep.tool_parser
        if choice.stopped is not None:
            content, calls, bad = parse(forced + choice.stopped)
        else:
            content, calls, bad = parse(forced + ep.record.decode(ids))
            if calls is None:
                content = ep.decode_text(forced_ids + ids)
        if bad:
            ep.counts["malformed_tool_calls"] += bad
        if forced and calls is None:  # the model did not complete the call it was given
            ep.counts["forced_tool_call_failed"] += 1
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = calls
            ep.counts["tool_call_replies"] += 1
        return reply


def _chunked(chunks: Callable[[dict[str, Any], bool], list[dict[str, Any]]]
             ) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    """A chat or text answer streamed as its chunks (usage last when ``stream_options``
    asks for it)."""
    def stream(answer: dict[str, Any], body: dict[str, Any]) -> Any:
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return sse(chunks(answer, usage))
    return stream
