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

How a chat template is rendered turn by turn (``ChatFormat``), and where the result
differs from rendering the whole conversation at once, is in docs/configuration.md
("Chat templates in multi-turn tasks").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_MEMO_ENTRIES = 8192  # texts whose ids a format remembers (observations repeat a lot)

# Stand-ins the template is rendered with at start-up. Plain words: templates trim,
# strip or split message contents (Llama, Gemma, Qwen3), and these survive all of it.
_PROBE_SYSTEM = "rollart-probe-system"
_PROBE_ACTION = "rollart-probe-action-{}"
_PROBE_OBS = "rollart-probe-observation-{}"
# The start-up check's episode: observations with the shapes envs send (lines, spaces).
_CHECK_OBS = ["pos=0,0 goal=3,3\nholes: 1,1", "pos=0,1", "You moved. Reward: 0.5\n", "  x = 3",
              "done?"]
_FIX = ("set the task's prompt_format: plain, or give the task a template that renders "
        "turn by turn (tasks[].chat_template: a .jinja file)")


class TemplateError(ValueError):
    """A chat template that cannot be rendered one turn at a time: the run would train
    on contexts the template never produces. Raised when the format is built, so that
    ``train`` and ``validate`` stop before any worker starts. ``reason``: the template's
    behaviour in a few words."""

    def __init__(self, reason: str, detail: str | None = None, fix: str = _FIX) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"the chat template cannot be rendered turn by turn: "
                         f"{detail or reason}\nFix: {fix}")


def _check_observation(observation: Any) -> str:
    """Observations are text (the env protocol, ``rollart_sdk.interfaces``); anything
    else was stringified silently before, which hides an env bug in the prompt."""
    if not isinstance(observation, str):
        raise TypeError(
            f"an env returned an observation of type {type(observation).__name__} "
            f"({str(observation)[:80]!r}); observations must be str: format it as text in "
            "the env's reset() and step()")
    return observation


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
        self.notes: list[str] = []

    def first_prompt(self, observation: str, system: str | None = None) -> list[int]:
        observation = _check_observation(observation)
        text = f"{system}\n{observation}\n" if system else f"{observation}\n"
        return list(self.tok(text)["input_ids"])

    def next_observation(self, observation: str, action_ids: list[int]) -> list[int]:
        return self._ids(f"\n{_check_observation(observation)}\n")


def prompt_format(tokenizer: Any, kind: str = "auto", system: str | None = None,
                  template: str | None = None,
                  template_kwargs: dict[str, Any] | None = None,
                  observation_role: str = "user") -> ChatFormat | PlainFormat:
    """``chat`` (the tokenizer's template; an error without one), ``plain``, or ``auto``.

    ``system``: the task's system prompt (the chat format is checked with it);
    ``template``: a chat template's text to use instead of the tokenizer's;
    ``template_kwargs``: extra template variables (``enable_thinking: false``);
    ``observation_role``: the chat role of observations after the first (``user`` or
    ``tool``; plain text has no roles)."""
    has_template = bool(template or getattr(tokenizer, "chat_template", None))
    if kind == "plain" or (kind == "auto" and not has_template):
        return PlainFormat(tokenizer)
    if not has_template:
        raise ValueError(
            "prompt_format: chat, but the model's tokenizer has no chat template; set the "
            "task's prompt_format to plain (or auto), or use a model with a template"
        )
    return ChatFormat(tokenizer, system=system, template=template,
                      template_kwargs=template_kwargs, observation_role=observation_role)


def task_prompt_format(tokenizer: Any, task: Any, system: str | None) -> ChatFormat | PlainFormat:
    """The prompt format of a ``TaskConfig`` (its ``prompt_format``, ``chat_template``
    file and ``chat_template_kwargs``) with its resolved system prompt; a ValueError
    names what is wrong (``job`` and ``preflight`` turn it into a ConfigError)."""
    template = None
    path = getattr(task, "chat_template", None)
    if path:
        try:
            template = Path(path).expanduser().read_text()
        except OSError as exc:
            raise ValueError(f"chat_template {path!r} cannot be read ({exc.strerror or exc}); "
                             "give the path of a .jinja file") from None
    return prompt_format(tokenizer, task.prompt_format, system, template,
                         getattr(task, "chat_template_kwargs", None),
                         getattr(task, "observation_role", "user"))


class ChatFormat(_Tokens):
    """Turns observations into token ids with a chat template, one turn at a time.

    The text that follows an action (the end of the assistant turn, the next user turn
    and the generation prompt) is the difference between two renders that both end in
    a user turn: ``[..., user, assistant, user(obs)]`` minus its prefix up to and
    including the assistant's content. Rendering two whole conversations and diffing
    them (rather than a conversation that ends in an assistant turn, which templates
    render differently: Qwen3 adds an empty think block to the last assistant message)
    is what makes the text right; at construction the result is checked against the
    template's render of a whole 5-turn episode, and a template that does not pass
    raises :class:`TemplateError`.

    Two template behaviours are handled deliberately rather than refused (both are
    recorded in ``notes`` and documented in docs/configuration.md):

    - the generation prompt differs from how earlier assistant turns are rendered
      (Qwen3 with ``enable_thinking: false`` adds an empty think block, DeepSeek-R1 opens
      ``<think>``, Mistral puts a space before a past reply): the context keeps the
      generation prompt the model was given at every turn (``generation_prompt``,
      ``history_opener``);
    - the template rejects, drops or moves a system message (Gemma 2 raises, Phi-3-mini
      drops it, Mistral moves it to the last user turn): the system prompt is put in
      front of the first observation, separated by a blank line (``system_folded``),
      as Gemma 3's own template does.
    """

    def __init__(self, tokenizer: Any, system: str | None = None, template: str | None = None,
                 template_kwargs: dict[str, Any] | None = None,
                 observation_role: str = "user") -> None:
        if observation_role not in ("user", "tool"):
            raise ValueError(f"observation_role must be 'user' or 'tool', got {observation_role!r}")
        self.observation_role = observation_role
        self.tok = tokenizer
        self.eos_id: int | None = tokenizer.eos_token_id
        self.template = template
        self.template_kwargs = dict(template_kwargs or {})
        self._first: dict[tuple[str, str | None], str] = {}
        self._rest: dict[str, str] = {}
        self._layouts: dict[bool, _Layout] = {}
        self._has_system = system is not None
        try:
            layout = self._layout(self._has_system)
        except TemplateError as exc:
            if observation_role == "user":
                raise
            raise TemplateError(exc.reason, f"with observations as tool messages: "
                                f"{exc.detail or exc.reason}",
                                fix="set the task's observation_role: user (observations as "
                                "user turns), or " + _FIX) from None
        # What the default case (the task's system prompt) looks like, for callers.
        self.system_folded = layout.folded
        self.history_opener = layout.opener
        self.generation_prompt = layout.generation
        self.assistant_end_ids: list[int] = layout.end_ids
        self.notes: list[str] = list(layout.notes)

    # ------------------------------------------------------------------ rendering
    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        kwargs = dict(self.template_kwargs)
        if self.template is not None:
            kwargs["chat_template"] = self.template
        return str(self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs))

    def _obs(self, observation: str) -> dict[str, str]:
        """An observation after the first, in the task's ``observation_role``."""
        return {"role": self.observation_role, "content": observation}

    def _head(self, system: str | None, folded: bool) -> list[dict[str, str]]:
        return [] if system is None or folded else [{"role": "system", "content": system}]

    @staticmethod
    def _fold(system: str | None, observation: str, folded: bool) -> str:
        return f"{system}\n\n{observation}" if folded and system is not None else observation

    def _layout(self, has_system: bool) -> _Layout:
        """The turn layout for prompts with (or without) a system prompt, derived and
        checked once; a system message the template cannot keep in place is folded."""
        layout = self._layouts.get(has_system)
        if layout is not None:
            return layout
        system = _PROBE_SYSTEM if has_system else None
        try:
            layout = self._derive(system, folded=False)
        except TemplateError as exc:
            if not has_system:
                raise
            # Folded, the system prompt is a plain part of the first observation: a
            # failure then is about the turns themselves, the error to report.
            layout = self._derive(system, folded=True)
            layout.notes.append(
                f"the chat template cannot keep a system message in place ({exc.reason}); "
                "the system prompt is put in front of the first observation, separated by "
                "a blank line")
        self._layouts[has_system] = layout
        return layout

    def _derive(self, system: str | None, folded: bool) -> _Layout:
        obs = [self._fold(system, _PROBE_OBS.format(0), folded), _PROBE_OBS.format(1),
               _PROBE_OBS.format(2)]
        act = [_PROBE_ACTION.format(0), _PROBE_ACTION.format(1)]
        head = self._head(system, folded)
        history = head + [_user(obs[0]), _assistant(act[0]), self._obs(obs[1])]
        with_gen = self._try_render(history, True, "a conversation ending in a user turn")
        if system is not None and not folded and system not in with_gen:
            raise TemplateError("it leaves the system message out of the prompt")
        longer = self._try_render(history + [_assistant(act[1]), self._obs(obs[2])], True,
                                  "a conversation one turn longer")
        layout = _Layout(folded=folded, history=history + [_assistant(act[1])])
        if longer.startswith(with_gen + act[1]):
            layout.cut = len(with_gen) + len(act[1])
            layout.generation = layout.opener = _generation_prompt(
                with_gen, self._try_render(history, False, "a conversation ending in a "
                                           "user turn, without a generation prompt"))
        else:
            without = self._try_render(history, False, "a conversation ending in a user "
                                       "turn, without a generation prompt")
            at = longer.find(act[1], len(without))
            if not (longer.startswith(without) and with_gen.startswith(without)) or at < 0:
                reason = "adding a turn changes how the earlier turns are rendered"
                raise TemplateError(reason, f"{reason}:\n" + _difference(
                    with_gen, longer, "rendered", "one turn longer"))
            layout.cut = at + len(act[1])
            layout.opener = longer[len(without):at]
            layout.generation = with_gen[len(without):]
            if layout.opener != layout.generation:
                layout.notes.append(
                    f"the chat template opens a past assistant turn with "
                    f"{layout.opener!r} but its generation prompt is "
                    f"{layout.generation!r}; the context keeps the generation prompt the "
                    "model was given at every turn")
        layout.prefix = longer[:layout.cut]
        rest = self._rest_text(layout, obs[2])
        if obs[2] not in rest:  # a template that ignores a role drops the message whole
            raise TemplateError(f"it leaves a {self.observation_role} message out of the "
                                "prompt")
        ids = self._ids(rest)
        if ids and self._is_special(ids[0]):
            layout.end_ids = [ids[0]]
        self._check(layout, system)
        return layout

    def _try_render(self, messages: list[dict[str, str]], gen: bool, what: str) -> str:
        try:
            return self._render(messages, gen)
        except Exception as exc:  # noqa: BLE001 - any template failure is this error
            raise TemplateError(f"it raises on {what}: {type(exc).__name__}: {exc}") from None

    def _rest_text(self, layout: _Layout, observation: str) -> str:
        rendered = self._try_render(layout.history + [self._obs(observation)], True,
                                    "a new observation")
        if not rendered.startswith(layout.prefix):
            reason = "an observation changes how the earlier turns are rendered"
            raise TemplateError(reason, f"{reason}:\n" + _difference(
                layout.prefix, rendered, "before", f"with {observation[:40]!r}"))
        return rendered[layout.cut:]

    def _is_special(self, token_id: int) -> bool:
        """A token that decodes to nothing without special tokens (an end-of-turn token
        such as ``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ``</s>``)."""
        return not self.tok.decode([token_id], skip_special_tokens=True)

    def _check(self, layout: _Layout, system: str | None) -> None:
        """The turn-by-turn text of a 5-turn episode against the template's render of
        the whole episode (with the generation prompt where past turns have their
        opener, when the two differ); a mismatch is a TemplateError."""
        obs = [self._fold(system, _CHECK_OBS[0], layout.folded)] + _CHECK_OBS[1:]
        acts = [_PROBE_ACTION.format(k + 10) for k in range(len(obs) - 1)]
        head = self._head(system, layout.folded)
        built = self._try_render(head + [_user(obs[0])], True, "a first observation")
        messages = head + [_user(obs[0])]
        for action, observation in zip(acts, obs[1:], strict=True):
            built += action + self._rest_text(layout, observation)
            messages += [_assistant(action), self._obs(observation)]
        whole = self._try_render(messages, True, "a whole episode")
        if layout.opener != layout.generation:
            for action in acts:
                whole = whole.replace(layout.opener + action, layout.generation + action, 1)
        if built != whole:
            reason = "rendering it turn by turn does not give its render of the whole episode"
            raise TemplateError(reason, f"{reason}:\n" + _difference(
                whole, built, "whole episode", "turn by turn"))

    # ------------------------------------------------------------------ the interface
    def first_prompt(self, observation: str, system: str | None = None) -> list[int]:
        """Ids of the template's render of [system,] the first observation and the
        generation prompt. No special tokens are added: a BOS is there when the
        template writes one (as transformers' ``apply_chat_template`` tokenises)."""
        observation = _check_observation(observation)
        rendered = self._first.get((observation, system))
        if rendered is None:  # the template rendered once per distinct first observation
            layout = self._layout(system is not None)
            messages = self._head(system, layout.folded)
            messages.append(_user(self._fold(system, observation, layout.folded)))
            if len(self._first) >= _MEMO_ENTRIES:
                self._first.clear()
            rendered = self._first[(observation, system)] = self._render(
                messages, add_generation_prompt=True)
        return self._ids(rendered)

    def next_observation(self, observation: str, action_ids: list[int]) -> list[int]:
        """Ids that follow the engine's ``action_ids``: the end of the assistant turn
        (minus its end token when the engine already produced it: it stopped on it),
        the next user turn and the generation prompt, as for episodes with the system
        prompt (or none) the format was built with."""
        observation = _check_observation(observation)
        layout = self._layout(self._has_system)
        rest = self._rest.get(observation)
        if rest is None:
            if len(self._rest) >= _MEMO_ENTRIES:
                self._rest.clear()
            rest = self._rest[observation] = self._rest_text(layout, observation)
        ids = self._ids(rest)
        end = layout.end_ids
        if end and action_ids and action_ids[-1] == end[0] and ids[:1] == end:
            ids = ids[1:]
        return ids


class _Layout:
    """How one template renders turns (for prompts with or without a system prompt)."""

    def __init__(self, folded: bool, history: list[dict[str, str]]) -> None:
        self.folded = folded
        self.history = history  # probe conversation a new observation is appended to
        self.prefix = ""  # its render up to the end of the last assistant's content
        self.cut = 0  # len(prefix)
        self.opener = ""  # what opens a past assistant turn
        self.generation = ""  # the generation prompt
        self.end_ids: list[int] = []  # the special token that ends an assistant turn
        self.notes: list[str] = []


def _user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def _assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


def _generation_prompt(with_gen: str, without: str) -> str:
    return with_gen[len(without):] if with_gen.startswith(without) else ""


def _difference(one: str, other: str, one_name: str, other_name: str) -> str:
    """Where two renders part, with some context either side."""
    at = next((i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b),
              min(len(one), len(other)))
    lo = max(0, at - 60)
    width = max(len(one_name), len(other_name))
    return (f"  {one_name:<{width}} ...{one[lo:at + 60]!r}\n"
            f"  {other_name:<{width}} ...{other[lo:at + 60]!r}")
