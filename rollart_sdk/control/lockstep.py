"""Lockstep environment interaction (``rollout.interaction: batched``, the paper's "Sync").

All trajectories of one wave (the launches of one iteration) take turn ``t`` together:
none asks for its action of turn ``t`` before every other live member has finished its
environment step of turn ``t - 1``. Each turn therefore waits for the slowest environment
of the batch, as batched environment interaction does; generation requests of a turn reach
the engine together and are batched there. A trajectory that ends (done, dropped, aborted)
leaves the wave and is no longer waited for.

:class:`StartGate` holds trajectories launched ahead of their weights (sync mode's
``rollout.reset_ahead``): they reset their environments while the trainer trains, then
wait at the gate before their first generation until the engines serve the new version.
"""

from __future__ import annotations

import asyncio


class TurnBarrier:
    """One wave's barrier; members are trajectory ids."""

    def __init__(self) -> None:
        self._turn: dict[str, int] = {}  # member -> turn it is waiting to start
        self._changed = asyncio.Event()

    def join(self, member: str) -> None:
        self._turn[member] = 0
        self._notify()

    def leave(self, member: str) -> None:
        if self._turn.pop(member, None) is not None:
            self._notify()

    @property
    def members(self) -> int:
        return len(self._turn)

    async def arrive(self, member: str, turn: int) -> None:
        """Wait until every live member is ready to start ``turn`` (or this one left)."""
        if member not in self._turn:
            return
        self._turn[member] = turn
        self._notify()
        while member in self._turn and any(t < turn for t in self._turn.values()):
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class StartGate:
    """Trajectories launched before the weights they are for (``rollout.reset_ahead``):
    each resets its environment, then :meth:`wait` holds it until :meth:`open` (the
    engines serve the new version) or until it is let go by
    :meth:`leave` (aborted meanwhile)."""

    def __init__(self) -> None:
        self._open = False
        self._waiting: dict[str, asyncio.Future[None]] = {}

    @property
    def is_open(self) -> bool:
        return self._open

    async def wait(self, member: str) -> None:
        if self._open:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[member] = fut
        try:
            await fut
        finally:
            if self._waiting.get(member) is fut:
                del self._waiting[member]

    def leave(self, member: str) -> None:
        """Let ``member`` go without opening (it was aborted while held)."""
        fut = self._waiting.pop(member, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def open(self) -> None:
        self._open = True
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_result(None)
