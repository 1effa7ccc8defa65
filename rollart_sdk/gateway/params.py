"""A request's sampling fields: mapped onto the task's sampling, or refused naming the field.

The trainer recomputes the log-probs of the task's policy (``tasks[].sampling``), so a
request may not change that policy: ``temperature`` / ``top_p`` equal to the task's (or
unset) are accepted, others refused (400); penalties and ``logit_bias`` likewise, and the
engines' own extensions (``top_k``, ``min_p``, ``repetition_penalty``, sent through the
client's ``extra_body``). Constrained output (``response_format`` other than text, vLLM's
``guided_*``, ``structured_outputs``) is refused: the engines sample without a grammar, so
the reply would not be bound to the schema the agent relies on. What
does not change the policy is mapped: ``max_tokens`` / ``max_completion_tokens`` (capped
by the task's ``max_new_tokens``), ``seed`` (mixed with the episode's seed, so that the
members of a GRPO group still differ), ``n`` (up to :data:`MAX_N` choices, each recorded
as its own branch), ``stop`` (up to :data:`MAX_STOP` strings: the reply and the recorded
tokens end where the first one appears).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.gateway.episode import GatewayError
from rollart_sdk.types import GenerationResult, SamplingParams

MAX_N = 8  # choices per request
MAX_STOP = 4  # stop sequences per request (OpenAI's own limit)
# Fields that would change the sampled policy: accepted only at their neutral value.
_NEUTRAL: dict[str, tuple[Any, ...]] = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
            "logit_bias": ({},), "best_of": (1,), "echo": (False,), "suffix": ("",),
            "repetition_penalty": (1, 1.0), "min_p": (0, 0.0)}
# Fields that ask for constrained output (OpenAI's and vLLM's / SGLang's extensions).
_CONSTRAINED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                "structured_outputs", "regex", "json_schema", "ebnf")


@dataclass
class RequestParams:
    """What the gateway takes from a request's sampling fields."""

    sampling: SamplingParams  # the first choice's; choice i's seed is seed + i
    n: int = 1
    stop: list[str] = field(default_factory=list)


def _positive_int(body: dict[str, Any], key: str, upper: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (
            upper is not None and value > upper):
        bound = f" up to {upper}" if upper is not None else ""
        raise GatewayError(400, f"{key} must be a positive integer{bound}, got {value!r}",
                           param=key)
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None or stop == []:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or len(stops) > MAX_STOP
            or not all(isinstance(s, str) and s for s in stops)):
        raise GatewayError(400, f"stop must be a non-empty string or a list of up to "
                           f"{MAX_STOP} non-empty strings, got {stop!r}", param="stop")
    return list(stops)


def _same_policy(body: dict[str, Any], task: SamplingParams, strict: bool = True) -> None:
    for key, mine in (("temperature", task.temperature), ("top_p", task.top_p)):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GatewayError(400, f"{key} must be a number, got {value!r}", param=key)
        if strict and abs(float(value) - mine) > 1e-9:
            raise GatewayError(400, f"{key}={value} differs from the task's sampling "
                               f"({key}={mine}, tasks[].sampling.{key}): the trainer learns "
                               f"that policy; leave {key} unset or send {mine}", param=key)
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise GatewayError(400, f"top_k must be an integer, got {top_k!r}", param="top_k")
        off = top_k <= 0 and task.top_k <= 0  # -1 and 0 both mean "off"
        if strict and not off and top_k != task.top_k:
            raise GatewayError(400, f"top_k={top_k} differs from the task's sampling "
                               f"(top_k={task.top_k}, tasks[].sampling.top_k): the trainer "
                               f"learns that policy; leave top_k unset", param="top_k")
    _unconstrained(body)
    for key, neutral in _NEUTRAL.items():
        value = body.get(key)
        if value is not None and value not in neutral:
            raise GatewayError(400, f"{key}={value!r} is not supported by the rollart "
                               f"gateway (it would change the trained policy); leave {key} "
                               "unset", param=key)


def text_only(fmt: Any, param: str) -> None:
    """A 400 unless the output format ``fmt`` (chat's ``response_format``, the Responses
    API's ``text.format``, named ``param``) is unset or plain text."""
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise GatewayError(400, f"{param} {kind!r} is not supported by the rollart "
                           "gateway: the engines sample without a grammar, so the reply "
                           "would not be bound to it (and a constrained policy is not the "
                           f"one the trainer learns); leave {param} unset and ask for the "
                           "format in the prompt (parse and validate it in the agent; an "
                           "Agents SDK agent: no output_type)", param=param)


def _unconstrained(body: dict[str, Any]) -> None:
    """A 400 for a request that asks for output bound to a schema or grammar."""
    text_only(body.get("response_format"), "response_format")
    for key in _CONSTRAINED:
        if body.get(key) is not None:
            raise GatewayError(400, f"{key} (constrained decoding) is not supported by the "
                               "rollart gateway: the engines sample without a grammar; "
                               f"leave {key} unset and ask for the format in the prompt",
                               param=key)


def request_params(body: dict[str, Any], task: SamplingParams, episode_seed: int,
                   request_index: int, strict: bool = True) -> RequestParams:
    """The request's sampling, or a 400 naming the field that cannot be honoured;
    ``strict`` False (an evaluation: nothing is trained) takes any temperature / top_p
    and samples with the task's."""
    _same_policy(body, task, strict)
    n = _positive_int(body, "n", MAX_N) or 1
    new = task.max_new_tokens
    for key in ("max_completion_tokens", "max_tokens"):
        limit = _positive_int(body, key)
        if limit is not None:
            new = min(new, limit)
            break
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise GatewayError(400, f"seed must be an integer, got {seed!r}", param="seed")
    # Without a seed each request draws a new one; with one, the same request of the same
    # episode repeats, while two episodes (a GRPO group's members) still differ.
    base = episode_seed * 1009 + (request_index if seed is None else 7919 * (seed % 2**31))
    sampling = SamplingParams(temperature=task.temperature, top_p=task.top_p,
                              top_k=task.top_k, max_new_tokens=new, seed=base % 2**62)
    return RequestParams(sampling, n, _stop(body))


def choice_sampling(params: RequestParams, i: int) -> SamplingParams:
    s = params.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          max_new_tokens=s.max_new_tokens, seed=(s.seed or 0) + 104729 * i)


def cut_at_stop(result: GenerationResult, decode: Callable[[list[int]], str],
                stops: list[str]) -> tuple[GenerationResult, str | None]:
    """``result`` up to the first stop sequence: the generated tokens through the one that
    completes it (what the model wrote, never a token it did not) and the text before it.
    ``(result, None)`` when no stop sequence appears."""
    if not stops:
        return result, None
    ids = result.token_ids
    if not any(s in decode(ids) for s in stops):
        return result, None
    for k in range(1, len(ids) + 1):
        text = decode(ids[:k])
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            cut = GenerationResult(result.request_id, ids[:k], result.logprobs[:k],
                                   result.versions[:k], "stop", result.recomputed,
                                   result.worker)
            return cut, text[:min(hits)]
    return result, None


# Template variables a request may not set: the gateway's own arguments to the render.
_RENDER_ARGS = frozenset({"messages", "conversation", "tools", "documents", "chat_template",
                          "add_generation_prompt", "continue_final_message", "tokenize",
                          "return_dict"})


def chat_template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    """A chat request's ``chat_template_kwargs`` (vLLM's and SGLang's field, sent through
    the client's ``extra_body``: ``{"enable_thinking": false}`` for Qwen 3): extra
    variables for the template's render of this request, over the task's
    ``chat_template_kwargs``. They change the prompt (never trained), not the policy."""
    kw = body.get("chat_template_kwargs")
    if kw is None:
        return None
    if not isinstance(kw, dict) or not all(isinstance(k, str) for k in kw):
        raise GatewayError(400, "chat_template_kwargs must be an object of template "
                           f"variables, got {kw!r}", param="chat_template_kwargs")
    taken = sorted(set(kw) & _RENDER_ARGS)
    if taken:
        raise GatewayError(400, f"chat_template_kwargs may not set {taken}: the gateway "
                           "passes those to the template itself (send messages and tools "
                           "as the request's fields)", param="chat_template_kwargs")
    return dict(kw)
