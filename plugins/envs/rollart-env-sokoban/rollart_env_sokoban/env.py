"""Sokoban with text observations and text actions (multi-turn, one move per turn).

Levels are fixed (shipped in :mod:`rollart_env_sokoban.levels`, or given as rows) or
generated at every reset from the reset seed. A reply is parsed for the first of
Up / Down / Left / Right; the env's ``action_vocabulary`` lets the control plane
constrain sampling to those four tokens (``tasks[].constrain_actions``), as FrozenLake does.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollart_env_sokoban.levels import LEVELS, MOVES, Level, generate_level, parse_level

ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")
_ACTION_RE = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_BY_LOWER = {a.lower(): a for a in ACTIONS}
_CHARSET = string.printable
_MAX_OBS_CHARS = 8192


class SokobanOptions(BaseModel):
    """Options of env ``sokoban`` (``tasks[].env.options`` in a run config)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["fixed", "generated"] = Field(
        "generated", description="'fixed': shipped or custom levels; 'generated': a new level per reset"
    )
    levels: list[str] | None = Field(
        None, description=f"fixed mode: names of shipped levels to draw from ({', '.join(LEVELS)}); "
        "default all"
    )
    custom: list[str] | None = Field(
        None, description="fixed mode: one level as rows of # _ O X * P S"
    )
    height: int = Field(6, ge=4, le=12, description="generated mode: rows, walls included")
    width: int = Field(6, ge=4, le=12, description="generated mode: columns, walls included")
    num_boxes: int = Field(1, ge=1, le=4, description="generated mode: boxes (and targets)")
    reverse_steps: int = Field(
        40, ge=1, le=1000, description="generated mode: length of the reverse-play walk (difficulty)"
    )
    max_steps: int = Field(20, ge=1, description="truncate after this many moves")
    reward_shape: Literal["sparse", "shaped"] = Field(
        "sparse", description="'sparse': 1 when solved; 'shaped': also +-0.1 per box on/off a target"
    )
    invalid_action_penalty: float = Field(
        0.0, ge=0.0, description="subtracted from the reward of a reply with no move in it"
    )

    @field_validator("levels")
    @classmethod
    def _known(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        unknown = [n for n in names if n not in LEVELS]
        if unknown or not names:
            raise ValueError(f"unknown level(s) {unknown}; shipped levels: {', '.join(LEVELS)}")
        return names

    @field_validator("custom")
    @classmethod
    def _parses(cls, rows: list[str] | None) -> list[str] | None:
        if rows is not None and parse_level(rows).solved:  # parse raises naming the bad row
            raise ValueError("the custom level is already solved (every box is on a target)")
        return rows

    @model_validator(mode="after")
    def _consistent(self) -> SokobanOptions:
        if self.mode == "generated" and (self.levels is not None or self.custom is not None):
            raise ValueError("levels / custom are for mode: fixed; set mode: fixed or drop them")
        if self.levels is not None and self.custom is not None:
            raise ValueError("give either levels (shipped names) or custom (rows), not both")
        if self.mode == "generated" and 2 * self.num_boxes + 2 > (self.height - 2) * (self.width - 2):
            raise ValueError(f"{self.num_boxes} boxes do not fit a {self.height}x{self.width} level")
        return self


def parse_action(action: Any) -> str | None:
    """The first of Up/Down/Left/Right in a reply (case-insensitive, whole words), or None."""
    if not isinstance(action, str):
        return None
    match = _ACTION_RE.search(action)
    return _BY_LOWER[match.group(1).lower()] if match else None


class SokobanTextEnv(gymnasium.Env):
    """Push every box (X) onto a target (O). ``reset(seed=s)`` is deterministic in ``s``.

    A reply without a move is a no-op step with ``info["invalid_action"] = True``; it
    never raises. Solving gives reward 1.0, ``terminated`` and ``info["success"]``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_vocabulary: list[str] = list(ACTIONS)

    def __init__(self, render_mode: str | None = None, **options: Any) -> None:
        self.options = SokobanOptions(**options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'ansi' or None")
        self.render_mode = render_mode
        self.action_vocabulary = list(ACTIONS)
        self.observation_space = spaces.Text(max_length=_MAX_OBS_CHARS, min_length=1, charset=_CHARSET)
        self.action_space = spaces.Text(max_length=256, min_length=1, charset=_CHARSET)
        self.level: Level | None = None
        self._steps = 0
        self._done = False
        self._obs = ""
        self.system_prompt = (
            "You are playing Sokoban. Push every box onto a target. Symbols: # wall, _ floor, "
            "O target, X box, * box on a target, P you, S you on a target. You push a box by "
            "walking into it; a box cannot be pulled, and it stops at walls and other boxes. "
            "Up decreases the row, Right increases the column. "
            "Reply with exactly one action: Up, Down, Left or Right."
        )

    def _new_level(self) -> Level:
        o = self.options
        if o.mode == "generated":
            return generate_level(self.np_random, o.height, o.width, o.num_boxes, o.reverse_steps)
        if o.custom is not None:
            return parse_level(o.custom, "custom")
        names = o.levels or list(LEVELS)
        name = names[int(self.np_random.integers(len(names)))]
        return parse_level(LEVELS[name], name)

    def _render(self, note: str = "") -> str:
        assert self.level is not None
        grid = "\n".join(self.level.rows())
        return f"{note}\n{grid}" if note else grid

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.level = self._new_level()
        self._steps = 0
        self._done = False
        self._obs = self._render()
        info = self._info(None, invalid=False)
        info["level"] = self.level.name or "generated"
        return self._obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.level is None:
            raise RuntimeError("SokobanTextEnv.step called before reset(); call reset() first")
        if self._done:
            raise RuntimeError("SokobanTextEnv: the episode is over; call reset() first")
        self._steps += 1
        move = parse_action(action)
        reward = 0.0
        note = ""
        if move is None:
            reward -= self.options.invalid_action_penalty
            shown = action if isinstance(action, str) else repr(action)
            note = f"Invalid action {shown[:40]!r}: reply with one of {', '.join(ACTIONS)}."
        else:
            moved, delta = self.level.move(move)
            if self.options.reward_shape == "shaped":
                reward += 0.1 * delta
            if not moved:
                note = f"{move} is blocked."
        terminated = self.level.solved
        if terminated:
            reward += 1.0
            note = "All boxes are on targets: solved!"
        truncated = not terminated and self._steps >= self.options.max_steps
        self._done = terminated or truncated
        self._obs = self._render(note)
        return self._obs, float(reward), terminated, truncated, self._info(move, move is None)

    def _info(self, action: str | None, invalid: bool) -> dict[str, Any]:
        assert self.level is not None
        return {
            "action": action,
            "invalid_action": invalid,
            "success": self.level.solved,
            "boxes_on_target": self.level.boxes_on_target,
            "boxes": len(self.level.boxes),
            "position": list(self.level.player),
            "steps": self._steps,
        }

    def render(self) -> str | None:
        return self._obs if self.render_mode == "ansi" else None


__all__ = ["ACTIONS", "MOVES", "SokobanOptions", "SokobanTextEnv", "parse_action"]
