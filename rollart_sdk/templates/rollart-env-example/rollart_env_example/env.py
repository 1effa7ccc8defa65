"""Environment ``example``: a text environment (gymnasium API, str observations and actions).

Replace the echo game with yours; ``tests/test_example.py`` runs rollart's conformance kit
(``check_env``) on it. Never raise on a bad reply: answer it and set
``info["invalid_action"]``. An exception in ``step`` during a run ends that trajectory; it
is dropped and counted with the reason.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon")


class ExampleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt option is an error, not ignored

    # Not "max_turns": that is the task key (tasks[].max_turns) capping turns for every env;
    # this is the env's own limit. Set the task's max_turns at least as high.
    max_replies: int = Field(3, ge=1, description="replies before the episode is truncated")


class ExampleEnv(gymnasium.Env):
    """Echo: the env shows a word; repeating it ends the episode with reward 1."""

    system_prompt = "Repeat the word you are shown, exactly."
    action_vocabulary = None  # free text: any reply is allowed

    def __init__(self, **options: Any) -> None:
        self.options = ExampleOptions(**options)
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Text(max_length=200, charset=string.printable)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)  # seeds self.np_random: same seed, same word
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        self.turns = 0
        return "Repeat: " + self.word, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turns += 1
        reply = action.strip().lower() if isinstance(action, str) else ""
        success = reply == self.word
        truncated = not success and self.turns >= self.options.max_replies
        info = {"success": success, "invalid_action": not reply}
        obs = "Correct!" if success else "No. Repeat: " + self.word
        return obs, 1.0 if success else 0.0, success, truncated, info
