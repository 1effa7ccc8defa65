"""Sokoban levels: the text format, a few fixed levels, a seeded generator and a solver.

Symbols (one character per cell, rows top to bottom)::

    #  wall        _  floor       O  target
    X  box         *  box on a target
    P  player      S  player on a target

Generated levels are made by *reverse play* (as gym-sokoban does): boxes start on their
targets and the player walks and *pulls* boxes away. Every pull is the inverse of a push,
so replaying the walk backwards solves the level: a generated level is solvable by
construction (the tests also check it with :func:`solve`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

Pos = tuple[int, int]
# Action name -> (d_row, d_col); row 0 is the top row.
MOVES: dict[str, Pos] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


@dataclass
class Level:
    """A Sokoban state: static walls/targets and the moving player/boxes."""

    height: int
    width: int
    walls: frozenset[Pos]
    targets: frozenset[Pos]
    boxes: set[Pos] = field(default_factory=set)
    player: Pos = (0, 0)
    name: str = ""

    def copy(self) -> Level:
        return Level(self.height, self.width, self.walls, self.targets, set(self.boxes),
                     self.player, self.name)

    @property
    def solved(self) -> bool:
        return self.boxes == set(self.targets)

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    def free(self, pos: Pos) -> bool:
        """Inside the map, not a wall, not a box."""
        r, c = pos
        return (0 <= r < self.height and 0 <= c < self.width and pos not in self.walls
                and pos not in self.boxes)

    def move(self, action: str) -> tuple[bool, int]:
        """Apply one move. Returns (the player moved, change in boxes on target)."""
        dr, dc = MOVES[action]
        r, c = self.player
        nxt = (r + dr, c + dc)
        if nxt in self.walls or not (0 <= nxt[0] < self.height and 0 <= nxt[1] < self.width):
            return False, 0
        delta = 0
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if not self.free(beyond):
                return False, 0  # a box against a wall or another box does not move
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
            delta = int(beyond in self.targets) - int(nxt in self.targets)
        self.player = nxt
        return True, delta

    def rows(self) -> list[str]:
        out = []
        for r in range(self.height):
            line = []
            for c in range(self.width):
                p = (r, c)
                if p in self.walls:
                    ch = "#"
                elif p == self.player:
                    ch = "S" if p in self.targets else "P"
                elif p in self.boxes:
                    ch = "*" if p in self.targets else "X"
                else:
                    ch = "O" if p in self.targets else "_"
                line.append(ch)
            out.append("".join(line))
        return out


def parse_level(rows: list[str], name: str = "") -> Level:
    """A level from rows of ``# _ O X * P S``; errors say which row and symbol is wrong."""
    if not rows or any(len(r) != len(rows[0]) for r in rows) or not rows[0]:
        raise ValueError("a level is non-empty rows of equal length, e.g. ['#####', '#PXO#', '#####']")
    walls, targets, boxes = set(), set(), set()
    players = []
    for r, line in enumerate(rows):
        for c, ch in enumerate(line):
            p = (r, c)
            if ch not in "#_OX*PS":
                raise ValueError(f"row {r} column {c}: unknown symbol {ch!r}; use # _ O X * P S")
            if ch == "#":
                walls.add(p)
            if ch in "O*S":
                targets.add(p)
            if ch in "X*":
                boxes.add(p)
            if ch in "PS":
                players.append(p)
    if len(players) != 1:
        raise ValueError(f"a level needs exactly one player (P or S), found {len(players)}")
    if not boxes or len(boxes) != len(targets):
        raise ValueError(
            f"a level needs as many boxes as targets, and at least one: {len(boxes)} boxes, "
            f"{len(targets)} targets"
        )
    return Level(len(rows), len(rows[0]), frozenset(walls), frozenset(targets), boxes,
                 players[0], name)


# Small fixed levels, easiest first; each is solvable (tests/test_sokoban.py solves them).
LEVELS: dict[str, list[str]] = {
    "push-1": [
        "######",
        "#P_XO#",
        "######",
    ],
    "corridor-1": [
        "#######",
        "###__##",
        "#P_X_O#",
        "#__#__#",
        "#######",
    ],
    "corner-1": [
        "######",
        "#____#",
        "#_X__#",
        "#P_O_#",
        "######",
    ],
    "two-boxes": [
        "#######",
        "#_____#",
        "#_X_X_#",
        "#_O_O_#",
        "#__P__#",
        "#######",
    ],
}


def generate_level(rng: np.random.Generator, height: int = 6, width: int = 6, num_boxes: int = 1,
                   reverse_steps: int = 60, attempts: int = 50) -> Level:
    """A solvable level drawn from ``rng`` (same generator state -> same level)."""
    if height < 4 or width < 4:
        raise ValueError(f"generated levels need at least 4x4 cells, got {height}x{width}")
    interior = (height - 2) * (width - 2)
    if num_boxes < 1 or 2 * num_boxes + 2 > interior:
        raise ValueError(f"{num_boxes} boxes do not fit a {height}x{width} level")
    for _ in range(attempts):
        level = _try_generate(rng, height, width, num_boxes, reverse_steps)
        if level is not None:
            return level
    raise RuntimeError(
        f"could not generate a {height}x{width} level with {num_boxes} boxes in {attempts} "
        "attempts; use fewer boxes, a larger level or more reverse_steps"
    )


def _carve(rng: np.random.Generator, height: int, width: int) -> set[Pos]:
    """Floor cells made by a random walk inside the border (connected by construction)."""
    pos = (int(rng.integers(1, height - 1)), int(rng.integers(1, width - 1)))
    floor = {pos}
    direction = list(MOVES.values())[int(rng.integers(4))]
    target = max(4, int(0.6 * (height - 2) * (width - 2)))
    for _ in range(20 * target):
        if len(floor) >= target:
            break
        if rng.random() < 0.35:
            direction = list(MOVES.values())[int(rng.integers(4))]
        nxt = (pos[0] + direction[0], pos[1] + direction[1])
        if 1 <= nxt[0] < height - 1 and 1 <= nxt[1] < width - 1:
            pos = nxt
            floor.add(pos)
    return floor


def _try_generate(rng: np.random.Generator, height: int, width: int, num_boxes: int,
                  reverse_steps: int) -> Level | None:
    floor = _carve(rng, height, width)
    if len(floor) < 2 * num_boxes + 2:
        return None
    cells = sorted(floor)
    picks = rng.choice(len(cells), size=num_boxes + 1, replace=False)
    targets = frozenset(cells[int(i)] for i in picks[:num_boxes])
    walls = frozenset((r, c) for r in range(height) for c in range(width)) - frozenset(floor)
    level = Level(height, width, walls, targets, set(targets), cells[int(picks[-1])])
    best: tuple[int, int] = (0, 0)
    best_state: tuple[set[Pos], Pos] | None = None
    moves = list(MOVES.values())
    for _ in range(reverse_steps):
        dr, dc = moves[int(rng.integers(4))]
        r, c = level.player
        nxt = (r + dr, c + dc)
        if not level.free(nxt):
            continue
        behind = (r - dr, c - dc)
        if behind in level.boxes and rng.random() < 0.8:
            level.boxes.remove(behind)  # pull: the inverse of pushing it from here
            level.boxes.add((r, c))
        level.player = nxt
        off = len(level.boxes - level.targets)
        spread = sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in level.targets)
                     for b in level.boxes)
        if off and (off, spread) > best:
            best, best_state = (off, spread), (set(level.boxes), level.player)
    if best_state is None:
        return None
    level.boxes, level.player = best_state
    return level


def solve(level: Level, max_states: int = 200_000) -> list[str] | None:
    """Shortest move sequence that solves ``level`` (breadth-first), or None.

    ``max_states`` bounds the search; None is also returned when the bound is hit.
    """
    start = (level.player, frozenset(level.boxes))
    seen = {start}
    queue: deque[tuple[Pos, frozenset[Pos], list[str]]] = deque([(*start, [])])
    while queue:
        player, boxes, path = queue.popleft()
        if boxes == level.targets:
            return path
        for name in MOVES:
            state = Level(level.height, level.width, level.walls, level.targets, set(boxes), player)
            moved, _ = state.move(name)
            if not moved:
                continue
            key = (state.player, frozenset(state.boxes))
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > max_states:
                return None
            queue.append((*key, [*path, name]))
    return None
