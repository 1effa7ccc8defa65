"""Token-in/token-out multi-turn formatting.

A trajectory's context is the exact concatenation of token ids: the first prompt, then
for every turn the engine's action ids followed by the tokens of the next observation.
Earlier turns are never re-tokenised (re-tokenising decoded text drifts). Only each new
observation is rendered through the model's chat template and tokenised on its own.

Two formats share one interface (``first_prompt``, ``next_observation``, ``decode``,
``action_token_ids``): :class:`ChatFormat` (the tokenizer's chat template) and
:class:`PlainFormat` (observations and actions concatenated as text, one per line), for
tokenizers without a chat template (most base and tiny models). :func:`prompt_format`
picks one by a task's ``prompt_format`` (``auto``: chat when a template exists).
"""

from __future__ import annotations

from typing import Any

_PROBE_USER = "\x00user-probe\x00"
_PROBE_ASSISTANT = "\x00assistant-probe\x00"


_MEMO_ENTRIES = 8192  # texts whose ids a format remembers (observations repeat a lot)


class _Tokens:
    """What both formats share: decoding and single-token action words."""

    tok: Any
    _memo: dict[str, tuple[int, ...]]

    def _ids(self, text: str) -> list[int]:
        """The ids of ``text`` (no special tokens added), remembered: an env's
        observations repeat (FrozenLake has 16 positions), and a tokenizer call costs
        far more than a dict lookup on every turn of every trajectory."""
        memo = self.__dict__.setdefault("_memo", {})
        ids = memo.get(text)
        if ids is None:
            if len(memo) >= _MEMO_ENTRIES:
                memo.clear()
            ids = memo[text] = tuple(self.tok(text, add_special_tokens=False)["input_ids"])
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def action_token_ids(self, vocabulary: list[str]) -> list[int]:
        """Single token id of each action word; raises if a word is not one token."""
        ids = []
        bad = []
        for word in vocabulary:
            enc = self._ids(word)
            if len(enc) != 1:
                bad.append(f"{word!r} -> {len(enc)} tokens")
            else:
                ids.append(enc[0])
        if bad:
            raise ValueError(
                "constrain_actions needs every action to be a single token of the model's "
                f"tokenizer; not single tokens: {', '.join(bad)}. Set the task's "
                "constrain_actions: false, or use a model whose tokenizer has these tokens "
                "(a model.tiny tokenizer adds env action words as tokens)."
            )
        return ids


class PlainFormat(_Tokens):
    """No template: ``[system\n]obs\n`` then, after each action, ``\nobs\n``. The model's
    BOS token (if its tokenizer adds one) starts the first prompt."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eos_id: int | None = tokenizer.eos_token_id
        self.assistant_end_ids: list[int] = []

    def first_prompt(self, observation: str, system: str | None = None) -> list[int]:
        text = f"{system}\n{observation}\n" if system else f"{observation}\n"
        return list(self.tok(text)["input_ids"])

    def next_observation(self, observation: str, action_ids: list[int]) -> list[int]:
        return self._ids(f"\n{observation}\n")


def prompt_format(tokenizer: Any, kind: str = "auto") -> ChatFormat | PlainFormat:
    """``chat`` (the tokenizer's template; an error without one), ``plain``, or ``auto``."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if kind == "plain" or (kind == "auto" and not has_template):
        return PlainFormat(tokenizer)
    if not has_template:
        raise ValueError(
            "prompt_format: chat, but the model's tokenizer has no chat template; set the "
            "task's prompt_format to plain (or auto), or use a model with a template"
        )
    return ChatFormat(tokenizer)


class ChatFormat(_Tokens):
    """Turns observations into token ids with a tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eos_id: int | None = tokenizer.eos_token_id
        self._first: dict[tuple[str, str | None], str] = {}
        # Text the template puts after an assistant message (e.g. "<|im_end|>\n"), and
        # the text of a user turn + generation prompt, found by rendering probes once.
        base = [{"role": "user", "content": _PROBE_USER}]
        with_asst = base + [{"role": "assistant", "content": _PROBE_ASSISTANT}]
        rendered = self._render(with_asst, add_generation_prompt=False)
        self._assistant_end = rendered.split(_PROBE_ASSISTANT, 1)[1]
        full = self._render(
            with_asst + [{"role": "user", "content": _PROBE_USER}], add_generation_prompt=True
        )
        self._user_turn = full[len(rendered) :]
        end_ids = self._ids(self._assistant_end)
        self.assistant_end_ids: list[int] = end_ids

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def first_prompt(self, observation: str, system: str | None = None) -> list[int]:
        rendered = self._first.get((observation, system))
        if rendered is None:  # the template rendered once per distinct first observation
            messages = []
            if system:
                messages.append({"role": "system", "content": system})
            messages.append({"role": "user", "content": observation})
            if len(self._first) >= _MEMO_ENTRIES:
                self._first.clear()
            rendered = self._first[(observation, system)] = self._render(
                messages, add_generation_prompt=True)
        return self._ids(rendered)

    def next_observation(self, observation: str, action_ids: list[int]) -> list[int]:
        """Ids that follow the engine's ``action_ids``: the end of the assistant turn (minus
        what the engine already produced, e.g. its stop token) and the next user turn."""
        end = list(self.assistant_end_ids)
        if end and action_ids and action_ids[-1] == end[0]:
            end = end[1:]
        user = self._user_turn.replace(_PROBE_USER, observation)
        return end + self._ids(user)
