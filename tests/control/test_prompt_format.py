"""Plain prompt format for tokenizers without a chat template (most base/tiny models)."""

from __future__ import annotations

import pytest

from rollart_sdk.control.chat import ChatFormat, PlainFormat, prompt_format
from rollart_sdk.models import build_tokenizer


def test_plain_format_concatenates_observations_and_actions():
    tok = build_tokenizer(["Left", "Right"])
    tok.chat_template = None
    fmt = prompt_format(tok, "auto")
    assert isinstance(fmt, PlainFormat)
    (left,) = fmt.action_token_ids(["Left"])
    ids = fmt.first_prompt("pos=0,0", system="Reach G.")
    ids += [left] + fmt.next_observation("pos=0,1", [left])
    assert tok.decode(ids) == "Reach G.\npos=0,0\nLeft\npos=0,1\n"
    assert fmt.decode([left]) == "Left"
    with pytest.raises(ValueError, match="no chat template.*prompt_format to plain"):
        prompt_format(tok, "chat")


def test_auto_uses_the_template_when_there_is_one():
    tok = build_tokenizer(["Left"])
    assert isinstance(prompt_format(tok, "auto"), ChatFormat)
    assert isinstance(prompt_format(tok, "plain"), PlainFormat)
