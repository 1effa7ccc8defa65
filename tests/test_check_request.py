"""``rollart_sdk.interfaces.check_request``: what every engine (torch, vLLM, SGLang)
refuses before queueing a request, one message each naming the request and the fix."""

from __future__ import annotations

import pytest

from rollart_sdk.interfaces import check_request
from rollart_sdk.types import GenerationRequest, SamplingParams


def req(prompt: list[int], **sampling: object) -> GenerationRequest:
    return GenerationRequest("r7", prompt, SamplingParams(**sampling))  # type: ignore[arg-type]


def check(request: GenerationRequest, **kw: object) -> None:
    check_request(request, **{"vocab_size": 10, "max_len": 5, **kw})  # type: ignore[arg-type]


def test_a_request_the_engine_can_generate_passes() -> None:
    check(req([0, 9, 3, 4]))  # 4 prompt tokens < max_len 5, ids in [0, 10)
    check(req([1], max_new_tokens=1, allowed_token_ids=[0, 9]))


@pytest.mark.parametrize("request_, kw, message", [
    (req([]), {}, "request 'r7': prompt_ids is empty; give at least one token"),
    (req([1, 2, 3, 4, 5]), {},
     "request 'r7': prompt of 5 tokens does not fit max_len=5"),
    (req([1, 2, 3, 4, 5]), {"limit": "max_seq_len", "hint": " (engine option max_seq_len)"},
     "request 'r7': prompt of 5 tokens does not fit max_seq_len=5 (engine option max_seq_len)"),
    (req([1, 10, -1, 3]), {},
     "request 'r7': token ids [10, -1] outside the vocabulary [0, 10)"),
    (req([1], max_new_tokens=0), {}, "request 'r7': max_new_tokens must be >= 1, got 0"),
    (req([1], allowed_token_ids=[]), {},
     "request 'r7': allowed_token_ids must be non-empty ids in [0, 10)"),
    (req([1], allowed_token_ids=[3, 10]), {},
     "request 'r7': allowed_token_ids must be non-empty ids in [0, 10)"),
], ids=["empty", "too-long", "too-long-named", "vocab", "max-new", "allowed-empty",
        "allowed-vocab"])
def test_each_refusal_names_the_request_and_the_fix(request_: GenerationRequest,
                                                    kw: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        check(request_, **kw)
    assert str(err.value) == message


def test_the_first_problem_is_reported() -> None:
    # a too-long prompt is reported before its bad ids and its max_new_tokens
    with pytest.raises(ValueError, match="does not fit"):
        check(req([99] * 6, max_new_tokens=0))
