"""Guess-the-number: the smallest useful text environment."""

import re
import string

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field


class GuessOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a typo in a config is an error, not ignored

    low: int = 1
    high: int = Field(100, gt=1)
    max_guesses: int = Field(7, ge=1)


class GuessEnv(gymnasium.Env):
    system_prompt = "Guess the secret number. Reply with one whole number."
    action_vocabulary = None  # free text: any reply is allowed

    def __init__(self, **options):
        self.options = GuessOptions(**options)
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Text(max_length=200, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # seeds self.np_random: same seed, same secret
        o = self.options
        self.secret = int(self.np_random.integers(o.low, o.high + 1))
        self.guesses = 0
        return f"Guess a number between {o.low} and {o.high}.", {}

    def step(self, action):
        self.guesses += 1
        found = re.search(r"-?\d+", action) if isinstance(action, str) else None
        truncated = self.guesses >= self.options.max_guesses
        if found is None:  # never crash on a bad reply: say what is expected
            info = {"invalid_action": True, "success": False}
            return "Reply with a whole number.", 0.0, False, truncated, info
        guess = int(found.group())
        success = guess == self.secret
        obs = "Correct!" if success else ("Higher." if guess < self.secret else "Lower.")
        info = {"invalid_action": False, "success": success}
        return obs, 1.0 if success else 0.0, success, truncated and not success, info
