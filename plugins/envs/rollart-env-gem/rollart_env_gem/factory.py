"""What the plugin registers: one cheap factory per GEM id (GEM is imported on first use).

GEM ids (``game:Sokoban-v0-easy``, ``rg:basic_arithmetic``) are not valid gymnasium ids,
so each name is registered with a callable factory rather than an import string.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST = Path(__file__).with_name("data") / "manifest.json"
PREFIX = "gem/"
LOCAL_MATH = "math:local"  # GEM's MathEnv on the dataset shipped in this package


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    """``{"gem_llm": version, "registered": {id: facts}, "excluded": {id: reason}}``."""
    return json.loads(path.read_text())


class GemFactory:
    """``factory(**options)`` -> a :class:`rollart_env_gem.env.GemTextEnv` of one GEM id."""

    def __init__(self, gem_id: str) -> None:
        self.gem_id = gem_id

    def __call__(self, **options: Any) -> Any:
        from rollart_env_gem.env import GemTextEnv

        return GemTextEnv(gem_id=self.gem_id, **options)

    def __repr__(self) -> str:
        return f"GemFactory({self.gem_id!r})"
