"""Routing by task tag: the one rule that picks the workers allowed to serve a task.

A table maps task tags (and ``"default"``) to a pool name or a hardware name (the
``@hw_mapping`` decorator's table, or the config's task affinities via
``ResourcePlan.hw_affinity()``). :func:`workers_for_tag` is used by
:class:`~rollart_sdk.cluster.Cluster` (its tag-routed methods and ``workers_for_tag``),
by both spawners to build the LLMProxy's route table, and :func:`candidates` by the
LLMProxy to read that table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar


class Placed(Protocol):
    """What routing needs to know of a worker: where it runs and where it wanted to."""

    @property
    def name(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def hardware(self) -> str: ...
    @property
    def preferred(self) -> str: ...


class PoolLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def hardware(self) -> str: ...


W = TypeVar("W", bound=Placed)


def workers_for_tag(
    workers: Sequence[W], table: Mapping[str, str], pools: Iterable[PoolLike], tag: str
) -> list[W]:
    """Workers for ``tag``: those on the mapped pool/hardware; else those whose preferred
    pool was that hardware (the recorded fallback); else the default mapping's; else all."""
    target = table.get(tag, table.get("default"))
    if target is None:
        return list(workers)
    pools = list(pools)

    def on(hw: str) -> list[W]:
        return [w for w in workers if hw in (w.pool, w.hardware)]

    def preferred(hw: str) -> list[W]:
        names = {p.name for p in pools if hw in (p.name, p.hardware)}
        return [w for w in workers if w.preferred in names]

    for found in (on(target), preferred(target)):
        if found:
            return found
    default = table.get("default")
    if default is not None and default != target:
        found = on(default) or preferred(default)
        if found:
            return found
    return list(workers)


def route_table(
    workers: Sequence[Placed], table: Mapping[str, str], pools: Iterable[PoolLike],
    tags: Iterable[str],
) -> dict[str, list[str]]:
    """``{tag: [worker names], "default": [every worker]}`` for the LLMProxy."""
    pools = list(pools)
    routes = {tag: [w.name for w in workers_for_tag(workers, table, pools, tag)] for tag in tags}
    routes["default"] = [w.name for w in workers]
    return routes


def candidates(routes: Mapping[str, list[str]], tag: str) -> list[str]:
    """Names of the workers that may serve ``tag`` (the default route for unknown tags)."""
    return routes.get(tag) or routes["default"]
