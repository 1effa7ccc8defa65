"""Built-in placement policies (registered as ``affinity``, ``pack`` and ``spread``).

A policy only chooses a pool from the free capacity the ResourceManager measured; Ray then
places the worker inside that pool (placement groups on the pool's custom resource and
labels). Each choice comes with a reason, which is stored in the binding record.
"""

from __future__ import annotations


def _fmt(free: dict[str, float], pools: list[str]) -> str:
    return ", ".join(f"{p}: {free.get(p, 0.0):g} free" for p in pools)


def _none(preferred: str, candidates: list[str], free: dict[str, float], demand: float) -> str:
    return (
        f"no compatible pool has {demand:g} free slot(s) (preferred {preferred}; "
        f"{_fmt(free, candidates)})"
    )


class AffinityPlacement:
    """The paper's rule: the preferred pool when it has room, else the first compatible
    pool (in fallback order) that has, instead of waiting for the preferred one."""

    def choose(
        self,
        role: str,
        preferred: str,
        candidates: list[str],
        free: dict[str, float],
        demand: float,
    ) -> tuple[str | None, str]:
        if free.get(preferred, 0.0) >= demand:
            return preferred, f"preferred pool {preferred} has room"
        for pool in candidates:
            if pool != preferred and free.get(pool, 0.0) >= demand:
                return pool, (
                    f"preferred pool {preferred} unavailable ({free.get(preferred, 0.0):g} free, "
                    f"{role} needs {demand:g}); fell back to compatible pool {pool}"
                )
        return None, _none(preferred, candidates, free, demand)


class PackPlacement:
    """The compatible pool with the least room that still fits: fills pools one at a time,
    keeping whole pools (and their nodes) free for later, larger workers."""

    def choose(
        self,
        role: str,
        preferred: str,
        candidates: list[str],
        free: dict[str, float],
        demand: float,
    ) -> tuple[str | None, str]:
        fits = [p for p in candidates if free.get(p, 0.0) >= demand]
        if not fits:
            return None, _none(preferred, candidates, free, demand)
        # min() keeps the first of equals, so candidate order breaks ties.
        pool = min(fits, key=lambda p: free[p])
        return pool, f"pack: fullest compatible pool with room ({_fmt(free, fits)})"


class SpreadPlacement:
    """The compatible pool with the most room: spreads workers to keep pools evenly used."""

    def choose(
        self,
        role: str,
        preferred: str,
        candidates: list[str],
        free: dict[str, float],
        demand: float,
    ) -> tuple[str | None, str]:
        fits = [p for p in candidates if free.get(p, 0.0) >= demand]
        if not fits:
            return None, _none(preferred, candidates, free, demand)
        pool = max(fits, key=lambda p: free[p])
        return pool, f"spread: emptiest compatible pool ({_fmt(free, fits)})"
