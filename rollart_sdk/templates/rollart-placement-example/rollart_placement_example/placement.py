"""Placement policy ``example``: picks a pool for each worker and says why.

The ResourceManager calls ``choose`` with the role, its preferred pool, the compatible
pools (in fallback order), their free capacity and the worker's demand; the reason is
stored in the binding record ``rollart status`` shows.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ExampleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    headroom: float = Field(0.0, ge=0.0, description="free slots a pool must keep after placing")


class ExamplePlacement:
    """The preferred pool when it keeps ``headroom`` free slots, else the compatible pool
    with the most free capacity."""

    def __init__(self, headroom: float = 0.0) -> None:
        self.headroom = headroom

    def choose(self, role: str, preferred: str, candidates: list[str],
               free: dict[str, float], demand: float) -> tuple[str | None, str]:
        need = demand + self.headroom
        if free.get(preferred, 0.0) >= need:
            return preferred, f"preferred pool {preferred} keeps {self.headroom:g} free"
        fits = [p for p in candidates if free.get(p, 0.0) >= need]
        if not fits:
            return None, f"no compatible pool has {need:g} free slot(s) for {role}"
        best = max(fits, key=lambda p: free.get(p, 0.0))
        return best, f"{preferred} is short; {best} has the most room"
