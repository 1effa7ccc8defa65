"""Environment ``hilo``: guess a secret digit; after each guess the env says higher or lower."""

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field


class HiloOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt option is an error, not ignored

    high: int = Field(9, ge=1, le=9, description="the secret is a digit from 0 to high")
    max_guesses: int = Field(4, ge=1, description="guesses before the episode is truncated")


class HiloEnv(gymnasium.Env):
    """Higher/lower: the best next guess depends on the feedback so far."""

    system_prompt = "Guess the secret digit. Reply with one digit."

    def __init__(self, **options: Any) -> None:
        self.options = HiloOptions(**options)
        self.action_vocabulary = [str(d) for d in range(self.options.high + 1)]
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Text(max_length=200, charset=string.printable)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)  # seeds self.np_random: same seed, same secret
        self.secret = int(self.np_random.integers(self.options.high + 1))
        self.guesses = 0
        return f"Guess a digit from 0 to {self.options.high}.", {}

    def step(self, action: str):
        self.guesses += 1
        reply = action.strip() if isinstance(action, str) else ""
        truncated = self.guesses >= self.options.max_guesses
        # Every step's info carries the episode's facts: the reward sees the last one.
        info: dict[str, Any] = {"guesses": self.guesses, "high": self.options.high}
        if reply not in self.action_vocabulary:  # never raise on a bad reply
            info.update(invalid_action=True, success=False, distance=self.options.high)
            return "Reply with one digit.", 0.0, False, truncated, info
        guess = int(reply)
        success = guess == self.secret
        info.update(invalid_action=False, success=success, distance=abs(guess - self.secret))
        obs = "Correct!" if success else ("Higher." if guess < self.secret else "Lower.")
        return obs, 1.0 if success else 0.0, success, truncated and not success, info
