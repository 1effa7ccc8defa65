"""Repository-wide collection rule: a plugin folder with a ``ci.sh`` carries a heavy stack
(vLLM, megatron-core, Mooncake, ...) that its ci.sh installs into a venv of its own and tests
there; the core's run skips such a folder unless the plugin's package is importable here."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    path = Path(collection_path)
    if path.is_dir() and (path / "ci.sh").is_file() and path.name.startswith("rollart-"):
        module = path.name.replace("-", "_")
        if importlib.util.find_spec(module) is None:
            return True
    return None
