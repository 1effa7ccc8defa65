"""``Name a color.`` -> one word -> done. The env knows the categories but no answers.

A task where a rule cannot score: whether "lemon" names a fruit is world knowledge the env
does not carry, so the reward must come from a model that has it (reward ``judge``; with
``parser: likelihood`` and a template such as ``"Here is a {info[category]}:"``). The words
the policy may answer with are ``action_vocabulary`` (single tokens with
``tasks[].constrain_actions``), drawn from every category, so picking a fitting one has to
be learned. ``info["category"]`` tells the judge what was asked.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_WORDS: dict[str, list[str]] = {
    "color": ["red", "blue", "green", "yellow"],
    "animal": ["cat", "dog", "horse", "fish"],
    "fruit": ["apple", "banana", "grape", "lemon"],
    "feeling": ["happy", "sad", "angry", "calm"],
}


class CategoryOptions(BaseModel):
    """Options of env ``category`` (``tasks[].env.options``)."""

    model_config = ConfigDict(extra="forbid")

    categories: list[str] = Field(
        default_factory=lambda: list(DEFAULT_WORDS), min_length=1,
        description="what the prompt asks for, one drawn per episode",
    )
    words: list[str] = Field(
        default_factory=lambda: [w for ws in DEFAULT_WORDS.values() for w in ws],
        min_length=2, description="the answers the policy may give (its action vocabulary)",
    )
    seed: int | None = Field(None, description="seeds the first reset() given no seed")

    @model_validator(mode="after")
    def _distinct(self) -> CategoryOptions:
        if len(set(self.words)) != len(self.words):
            raise ValueError("words must be distinct")
        bad = [w for w in self.words if not w.strip() or any(c.isspace() for c in w)]
        if bad:
            raise ValueError(f"each word must be one word without spaces, got {bad}")
        return self


class CategoryEnv(gymnasium.Env):
    """One turn: the observation asks for a thing of a category, the action is a word."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None, **options: Any) -> None:
        self.options = CategoryOptions(**options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'ansi' or None")
        self.render_mode = render_mode
        self.action_vocabulary: list[str] = list(self.options.words)
        self.system_prompt = "Answer with one word."
        self.observation_space = spaces.Text(max_length=256, min_length=1, charset=string.printable)
        self.action_space = spaces.Text(max_length=256, min_length=0, charset=string.printable)
        self._first_reset = True
        self._category: str | None = None
        self._done = False
        self._obs = ""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        if seed is None and self._first_reset:
            seed = self.options.seed
        self._first_reset = False
        super().reset(seed=seed)
        cats = self.options.categories
        self._category = cats[int(self.np_random.integers(0, len(cats)))]
        self._done = False
        article = "an" if self._category[:1] in "aeiou" else "a"
        self._obs = f"Name {article} {self._category}."
        return self._obs, {"category": self._category}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._category is None or self._done:
            raise RuntimeError("CategoryEnv.step needs a reset() first (one turn per episode)")
        self._done = True
        word = str(action).strip()
        info = {"category": self._category, "word": word,
                "invalid_action": word not in self.action_vocabulary}
        self._obs = "Thanks."
        # The env cannot tell a fitting word from another: the reward is the judge's.
        return self._obs, 0.0, True, False, info

    def render(self) -> str | None:
        return self._obs if self.render_mode == "ansi" else None
