"""docs/architecture.md's "One trajectory, file by file" stays short and true: the stops the
walk names (the table's second column: the files where the trajectory's data enters a
part and is handed on) are at most ``MAX_STOPS`` distinct files (issue 32: 38 before), and
every file named anywhere in the section exists.

How a name in backticks resolves: ``plugins/``, ``rollart_sdk/``, ``tests/`` from the
repository root, ``control/pipeline.py`` from ``rollart_sdk/``; a bare ``engine.py`` is
the file of that name the section named before it, else a file in the folder of the row's
first stop (a plugin's own modules: ``step.py`` beside ``engine.py``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
MAX_STOPS = 20
FILE = re.compile(r"`([\w./-]+\.py)(?:::[\w.]+)?`")


def section(text: str, title: str = "## One trajectory, file by file") -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def _resolve(name: str, known: dict[str, Path], folder: Path | None) -> Path:
    if name.startswith(("plugins/", "rollart_sdk/", "tests/")):
        return ROOT / name
    if "/" in name:
        return ROOT / "rollart_sdk" / name
    if name in known:
        return known[name]
    return (folder or ROOT / "rollart_sdk") / name


def walk(text: str) -> tuple[list[Path], list[Path]]:
    """``(stops, every file named)`` of the walk section, each resolved (in order, with
    repeats)."""
    known: dict[str, Path] = {}
    stops: list[Path] = []
    named: list[Path] = []

    def take(cell: str, folder: Path | None) -> list[Path]:
        out = []
        for name in FILE.findall(cell):
            path = _resolve(name, known, folder)
            known.setdefault(path.name, path)
            out.append(path)
        return out

    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and cells[0].isdigit():
            row_stops = take(cells[1], None)
            folder = row_stops[-1].parent if row_stops else None
            stops += row_stops
            named += row_stops + [p for c in cells[2:] for p in take(c, folder)]
        else:
            named += take(line, None)
    return stops, named


def test_the_walk_resolves_bare_names_by_the_row_and_what_came_before() -> None:
    text = ("| # | stop | what | inside |\n|---|---|---|---|\n"
            "| 1 | `plugins/engines/e/e/engine.py::E.generate` | x | `step.py::run` |\n"
            "| 2 | `control/proxy.py::P.generate` -> `engine.py::E.load` | y | |\n"
            "\n- `types.py`: the data\n")
    stops, named = walk(text)
    engine = ROOT / "plugins/engines/e/e/engine.py"
    assert stops == [engine, ROOT / "rollart_sdk/control/proxy.py", engine]
    assert named[1] == ROOT / "plugins/engines/e/e/step.py"
    assert named[-1] == ROOT / "rollart_sdk/types.py"


def test_one_trajectory_crosses_at_most_twenty_files() -> None:
    stops, _ = walk(section(DOC.read_text()))
    distinct = sorted({str(p.relative_to(ROOT)) for p in stops})
    assert len(distinct) >= 10, distinct  # the parser still finds the table
    assert len(distinct) <= MAX_STOPS, (
        f"docs/architecture.md's walk stops at {len(distinct)} files (at most {MAX_STOPS}): "
        "merge modules that split one concern, or list a file the data does not pass "
        "through under 'Around the path':\n" + "\n".join(distinct))


def test_the_count_the_walk_states_is_the_count() -> None:
    text = section(DOC.read_text())
    stated = re.search(r"at most 20; (\d+) today", " ".join(text.split()))
    assert stated, "docs/architecture.md's walk no longer says how many stops it has"
    stops, _ = walk(text)
    assert int(stated.group(1)) == len(set(stops))


def test_every_file_the_walk_names_exists() -> None:
    _, named = walk(section(DOC.read_text()))
    missing = sorted({str(p.relative_to(ROOT)) for p in named if not p.is_file()})
    assert not missing, f"docs/architecture.md's walk names files that do not exist: {missing}"
