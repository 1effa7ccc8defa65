"""Guess the number with higher/lower feedback: a task whose best move depends on what it saw.

The env draws a secret in ``low..high``; the policy has ``turns`` guesses, and after each
wrong one the observation says which way the secret lies (``4 is too low.``). A policy
that ignores the feedback can at best try ``turns`` distinct numbers (success
``turns / n``); one that reads it can halve the range every turn (binary search: success
``(2**turns - 1) / n``). :func:`baselines` computes both, and the uniformly random
policy's rate, so a training curve can be read against them.
"""

from __future__ import annotations

import re
import string
from typing import Any

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, model_validator

_INT_RE = re.compile(r"-?\d+")
_CHARSET = string.printable


class GuessOptions(BaseModel):
    """Options of env ``guess`` (``tasks[].env.options`` in a run config)."""

    model_config = ConfigDict(extra="forbid")

    low: int = Field(1, ge=0, description="smallest number the secret can be")
    high: int = Field(8, ge=1, description="largest number the secret can be")
    turns: int = Field(3, ge=1, le=16, description="guesses per episode")
    seed: int | None = Field(
        None, description="seeds the first reset() that is given no seed (reproducible runs)"
    )
    show_range: bool = Field(
        False, description="after each wrong guess also say which numbers are still possible "
                           "('4 is too low: 5 to 8.'), so the feedback of earlier turns need "
                           "not be remembered")

    @model_validator(mode="after")
    def _range(self) -> GuessOptions:
        if self.high <= self.low:
            raise ValueError(f"high ({self.high}) must be greater than low ({self.low})")
        if self.high - self.low + 1 > 512:
            raise ValueError(f"{self.high - self.low + 1} numbers ({self.low}..{self.high}) is "
                             "more than 512 action words; narrow low..high")
        return self


def baselines(low: int = 1, high: int = 8, turns: int = 3) -> dict[str, float]:
    """Success rates to read a guess-the-number curve against (secret uniform in low..high).

    - ``random``: every guess uniform over the range, independently (what a constrained
      sampler does with a policy that has no preference): ``1 - (1 - 1/n) ** turns``;
    - ``ignore_feedback``: the best policy that does not read the feedback. Whatever it
      guesses is fixed before the episode starts, so it finds at most ``turns`` distinct
      numbers: ``min(turns, n) / n``;
    - ``binary_search``: the best policy there is. A policy that reads the feedback is a
      decision tree whose depth is ``turns``; such a tree has at most ``2**turns - 1``
      guessing nodes, so it finds at most that many secrets; guessing the middle of the
      numbers still possible reaches it: ``min(2**turns - 1, n) / n``.
    """
    n = high - low + 1
    return {
        "random": 1.0 - (1.0 - 1.0 / n) ** turns,
        "ignore_feedback": min(turns, n) / n,
        "binary_search": min(2**turns - 1, n) / n,
    }


def parse_guess(action: Any) -> int | None:
    """The first integer written in ``action`` ("I say 5" -> 5), or None."""
    if isinstance(action, int) and not isinstance(action, bool):
        return action
    if not isinstance(action, str):
        return None
    match = _INT_RE.search(action)
    return int(match.group()) if match else None


class GuessEnv(gymnasium.Env):
    """``Guess my number, 1 to 8.`` -> ``4`` -> ``4 is too low.`` -> ``6`` -> ``Correct: 6.``

    ``step(text)`` reads the first integer in ``text``. The right number ends the episode
    with reward 1.0; a wrong one gives 0.0 and the observation says whether the secret is
    higher or lower; the episode ends after ``turns`` guesses. A reply with no number in
    ``low..high`` uses up a guess, gets ``info["invalid_action"] = True`` and an
    observation that says what is allowed. With ``show_range`` the feedback also names the
    numbers still possible given every answer so far (``4 is too low: 5 to 8.``), so the
    latest observation is enough to act on. ``action_vocabulary`` is the numbers, so a task
    with ``constrain_actions: true`` answers with one of them.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_vocabulary: list[str] | None = None

    def __init__(self, render_mode: str | None = None, **options: Any) -> None:
        self.options = GuessOptions(**options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'ansi' or None")
        self.render_mode = render_mode
        o = self.options
        self.action_vocabulary = [str(i) for i in range(o.low, o.high + 1)]
        self.observation_space = spaces.Text(max_length=256, min_length=1, charset=_CHARSET)
        self.action_space = spaces.Text(max_length=256, min_length=0, charset=_CHARSET)
        self.system_prompt = (
            f"I have picked a whole number from {o.low} to {o.high}. You have {o.turns} "
            "guesses; after a wrong one I say whether your guess was too low or too high. "
            "Reply with the number only."
        )
        self._first_reset = True
        self._secret: int | None = None
        self._attempts = 0
        self._done = False
        self._obs = ""
        self._possible = (o.low, o.high)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        if seed is None and self._first_reset:
            seed = self.options.seed
        self._first_reset = False
        super().reset(seed=seed)
        self._secret = int(self.np_random.integers(self.options.low, self.options.high + 1))
        self._attempts = 0
        self._done = False
        self._possible = (self.options.low, self.options.high)
        self._obs = f"Guess my number, {self.options.low} to {self.options.high}."
        return self._obs, self._info(guess=None, success=False, invalid=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._secret is None:
            raise RuntimeError("GuessEnv.step called before reset(); call reset() first")
        if self._done:
            raise RuntimeError("GuessEnv: the episode is over; call reset() first")
        self._attempts += 1
        guess = parse_guess(action)
        invalid = guess is None or not self.options.low <= guess <= self.options.high
        success = guess == self._secret
        terminated = success or self._attempts >= self.options.turns
        self._done = terminated
        self._obs = self._feedback(guess, invalid, success, terminated)
        info = self._info(guess=guess, success=success, invalid=invalid)
        return self._obs, 1.0 if success else 0.0, terminated, False, info

    def _feedback(self, guess: int | None, invalid: bool, success: bool, over: bool) -> str:
        if success:
            return f"Correct: {self._secret}."
        if invalid or guess is None or self._secret is None:
            said = f"Reply with a number from {self.options.low} to {self.options.high}."
        else:
            said = self._direction(guess, self._secret)
        return f"{said} Out of guesses: it was {self._secret}." if over else said

    def _direction(self, guess: int, secret: int) -> str:
        lo, hi = self._possible
        lo, hi = (max(lo, guess + 1), hi) if guess < secret else (lo, min(hi, guess - 1))
        self._possible = (lo, hi)
        said = f"{guess} is too {'low' if guess < secret else 'high'}"
        if not self.options.show_range:
            return said + "."
        return said + (f": {lo} to {hi}." if lo < hi else f": {lo}.")

    def _info(self, guess: int | None, success: bool, invalid: bool) -> dict[str, Any]:
        return {
            "answer": str(self._secret),
            "guess": guess,
            "success": success,
            "invalid_action": invalid,
            "attempts": self._attempts,
            "possible": list(self._possible),
        }

    def render(self) -> str | None:
        return self._obs if self.render_mode == "ansi" else None
