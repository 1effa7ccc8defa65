"""FrozenLake with text observations and text actions.

The dynamics are gymnasium's ``FrozenLakeEnv`` (unchanged); this module only turns its
integer state into text an LLM can read and the LLM's reply into one of the four moves.
gymnasium's ``ansi`` render highlights the player with ANSI colour codes, which are noise
to a tokenizer and vanish when stripped, so the grid is drawn here with a ``P`` instead.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import MAPS, FrozenLakeEnv, generate_random_map
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Index i is gymnasium's action i (0 left, 1 down, 2 right, 3 up).
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
_ACTION_RE = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)
_INDEX = {name.lower(): i for i, name in enumerate(ACTIONS)}
_CHARSET = string.printable
_MAX_OBS_CHARS = 8192


class FrozenLakeOptions(BaseModel):
    """Options of env ``frozenlake`` (``tasks[].env.options`` in a run config)."""

    model_config = ConfigDict(extra="forbid")

    map_name: Literal["4x4", "8x8"] = Field(
        "4x4", description="gymnasium's built-in map; its size is also the random-map size"
    )
    desc: list[str] | None = Field(
        None, description="custom map rows of S/F/H/G, e.g. ['SFF', 'FHF', 'FFG']"
    )
    random_map: bool = Field(
        False, description="draw a new solvable map at every reset, from the reset seed"
    )
    random_map_p: float = Field(0.8, gt=0.0, le=1.0, description="P(cell is frozen) of random maps")
    # Not slippery by default: with gymnasium's slippery ice a move goes sideways 2/3 of the
    # time, so the same reply earns different rewards and a small policy learns very slowly.
    is_slippery: bool = Field(False, description="gymnasium's slippery ice (stochastic moves)")
    max_steps: int | None = Field(
        None, ge=1, description="truncate after this many steps; default 5 x the map's side"
    )
    obs_format: Literal["grid", "compact"] = Field(
        "grid", description="'grid': the map drawn as text; 'compact': 'pos=r,c goal=r,c holes=...'"
    )
    invalid_action_penalty: float = Field(
        0.0, ge=0.0, description="subtracted from the reward of a step whose reply has no action"
    )

    @field_validator("desc")
    @classmethod
    def _check_desc(cls, desc: list[str] | None) -> list[str] | None:
        if desc is None:
            return None
        if not desc or any(len(row) != len(desc[0]) for row in desc) or not desc[0]:
            raise ValueError("desc must be non-empty rows of equal length, e.g. ['SF', 'FG']")
        cells = "".join(desc)
        bad = sorted(set(cells) - set("SFHG"))
        if bad:
            raise ValueError(f"desc may only use S, F, H, G; found {bad}")
        if cells.count("S") != 1 or cells.count("G") < 1:
            raise ValueError("desc needs exactly one S (start) and at least one G (goal)")
        return desc

    @model_validator(mode="after")
    def _exclusive(self) -> FrozenLakeOptions:
        if self.desc is not None and self.random_map:
            raise ValueError("give either desc (a fixed map) or random_map: true, not both")
        return self


def parse_action(action: Any) -> int | None:
    """The gymnasium action id of a reply: the first of Left/Down/Right/Up in the text.

    Case and surrounding text are ignored ("I go down." -> 1). An int 0-3 is accepted as
    is. Anything else returns None (an invalid action, never an exception).
    """
    if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
        return int(action) if 0 <= int(action) < len(ACTIONS) else None
    if not isinstance(action, str):
        return None
    match = _ACTION_RE.search(action)
    return _INDEX[match.group(1).lower()] if match else None


class FrozenLakeTextEnv(gymnasium.Env):
    """gymnasium FrozenLake whose observations and actions are text.

    ``reset(seed=s)`` is deterministic for a given ``s`` (map, start and, when slippery,
    every transition). ``step(text)`` takes the first action word in ``text``; a reply
    without one is a no-op step with ``info["invalid_action"] = True``. Reaching the goal
    gives reward 1.0 and ``info["success"] = True``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_vocabulary: list[str] = list(ACTIONS)

    def __init__(self, render_mode: str | None = None, **options: Any) -> None:
        self.options = FrozenLakeOptions(**options)
        self.action_vocabulary = list(ACTIONS)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'ansi' or None")
        self.render_mode = render_mode
        self.observation_space = spaces.Text(
            max_length=_MAX_OBS_CHARS, min_length=1, charset=_CHARSET
        )
        self.action_space = spaces.Text(max_length=256, min_length=1, charset=_CHARSET)
        self._lake = self._make_lake(self._initial_desc())
        self._steps = 0
        self._done = False
        self._started = False
        self._obs = ""
        self.system_prompt = self._system_prompt()

    # --- map handling -------------------------------------------------------------------
    def _initial_desc(self) -> list[str]:
        if self.options.desc is not None:
            return list(self.options.desc)
        return list(MAPS[self.options.map_name])

    def _make_lake(self, desc: list[str]) -> FrozenLakeEnv:
        return FrozenLakeEnv(desc=desc, is_slippery=self.options.is_slippery)

    @property
    def desc(self) -> list[str]:
        """The current map as rows of S/F/H/G."""
        # gymnasium keeps it as a numpy array of single bytes
        return ["".join(c.decode() for c in row) for row in np.asarray(self._lake.desc)]

    @property
    def position(self) -> tuple[int, int]:
        """(row, column) of the player; row 0 is the top row."""
        return divmod(int(self._lake.s), int(self._lake.ncol))

    @property
    def max_steps(self) -> int:
        if self.options.max_steps is not None:
            return self.options.max_steps
        return 5 * max(int(self._lake.nrow), int(self._lake.ncol))

    # --- text -----------------------------------------------------------------------------
    def _system_prompt(self) -> str:
        if self.options.obs_format == "grid":
            layout = (
                "Each observation is the map: P is you, S the start, F frozen ice (safe), "
                "H a hole (falling in ends the game), G the goal."
            )
        else:
            layout = (
                "Each observation gives your position, the goal and the holes as "
                "row,column pairs (row 0 is the top row, column 0 the left column)."
            )
        slip = (
            " The ice is slippery: a move sometimes goes sideways."
            if self.options.is_slippery
            else ""
        )
        return (
            "You are playing FrozenLake. Reach the goal without stepping into a hole. "
            f"{layout} Down increases the row, Right increases the column.{slip} "
            "Reply with exactly one action: Left, Down, Right or Up."
        )

    def _render_text(self, note: str = "") -> str:
        row, col = self.position
        rows = self.desc
        if self.options.obs_format == "compact":
            cells = [(r, c, ch) for r, line in enumerate(rows) for c, ch in enumerate(line)]
            goals = " ".join(f"{r},{c}" for r, c, ch in cells if ch == "G")
            holes = ";".join(f"{r},{c}" for r, c, ch in cells if ch == "H") or "none"
            text = f"pos={row},{col} goal={goals} holes={holes}"
        else:
            lines = []
            for r, line in enumerate(rows):
                marked = ["P" if (r, c) == (row, col) else ch for c, ch in enumerate(line)]
                lines.append(" ".join(marked))
            text = "\n".join(lines)
        return f"{note}\n{text}" if note else text

    # --- gymnasium API --------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if self.options.random_map:
            size = 4 if self.options.map_name == "4x4" else 8
            map_seed = int(self.np_random.integers(0, 2**31 - 1))
            desc = generate_random_map(size=size, p=self.options.random_map_p, seed=map_seed)
            self._lake = self._make_lake(desc)
        # The inner env draws slippery transitions from its own generator: seed it from ours
        # so one reset seed fixes the whole episode.
        self._lake.reset(seed=int(self.np_random.integers(0, 2**31 - 1)))
        self._steps = 0
        self._done = False
        self._started = True
        self._obs = self._render_text()
        return self._obs, self._info(action=None, invalid=False, success=False) | {"map": self.desc}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("FrozenLakeTextEnv.step called before reset(); call reset() first")
        if self._done:
            raise RuntimeError("FrozenLakeTextEnv: the episode is over; call reset() first")
        self._steps += 1
        index = parse_action(action)
        if index is None:
            reward = 0.0 - float(self.options.invalid_action_penalty)
            terminated = False
            success = False
            shown = action if isinstance(action, str) else repr(action)
            note = f"Invalid action {shown[:40]!r}: reply with one of {', '.join(ACTIONS)}."
        else:
            _, r, terminated, _, _ = self._lake.step(index)
            reward = float(r)
            row, col = self.position
            cell = self.desc[row][col]
            success = cell == "G"
            note = ""
            if success:
                note = "You reached the goal!"
            elif cell == "H":
                note = "You fell into a hole."
        truncated = not terminated and self._steps >= self.max_steps
        self._done = bool(terminated or truncated)
        self._obs = self._render_text(note)
        info = self._info(
            action=ACTIONS[index] if index is not None else None,
            invalid=index is None,
            success=success,
        )
        return self._obs, reward, bool(terminated), bool(truncated), info

    def _info(self, action: str | None, invalid: bool, success: bool) -> dict[str, Any]:
        return {
            "action": action,
            "invalid_action": invalid,
            "success": success,
            "position": list(self.position),
            "steps": self._steps,
        }

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._obs
        return None
