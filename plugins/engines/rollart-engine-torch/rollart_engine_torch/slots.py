"""Per-request state and the KV slot table of engine ``torch``.

Each request inside the engine is a :class:`Seq`: its context (prompt + tokens generated
so far), what it sampled, the KV slot it holds in the runner and how many leading tokens
of its context already have their K/V in that slot. The :class:`SlotTable` hands slots
out and takes them back.

Multi-turn KV reuse: when a request of a trajectory (``request.trajectory_id``) finishes,
its slot is kept (an idle cache; a PD prefill request's too, so the prefill engine of a
prefill-decode pair also computes only each turn's new tokens). The trajectory's next request, whose prompt starts with
the cached tokens (token-in/token-out contexts always do), takes that slot back and only
its new tokens are computed. Idle caches are freed by ``TorchEngine.release`` (the
trajectory ended), by an ABORT, by eviction (least recently used first) when a request
needs a slot, and by a weight update (they hold the old policy's K/V; the next turn
recomputes).
"""

from __future__ import annotations

import asyncio
import collections
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from rollart_engine_torch.handoff import KVHandoff
from rollart_sdk.interfaces import check_request
from rollart_sdk.types import FinishReason, GenerationRequest, GenerationResult


@dataclass(eq=False)
class Seq:
    """One request's state inside the engine."""

    request: GenerationRequest
    tokens: list[int]  # prompt + generated so far
    future: asyncio.Future[Any]
    generator: torch.Generator | None
    stop_ids: frozenset[int]
    allowed: torch.Tensor | None
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    slot: int = -1
    cached: int = 0  # leading tokens whose K/V are in the slot
    recomputed: int = 0
    recomputing: bool = False  # its KV is being rebuilt under new weights (this step)
    finish: FinishReason | None = None
    handoff: KVHandoff | None = None  # K/V to import when admitted (decode side of PD)
    prefill_only: bool = False  # PD prefill side: compute K/V, sample nothing
    exported: tuple[Any, Any] | None = None  # PD prefill side: the computed K/V
    export_from: int = 0  # PD prefill side: the decode engine holds positions before this
    kv_kept: int = 0  # tokens whose K/V were kept for the trajectory's next turn

    @classmethod
    def from_request(cls, request: GenerationRequest, *, vocab_size: int, max_seq_len: int,
                     eos: frozenset[int], rng: random.Random) -> Seq:
        """Check ``request`` against the model and engine limits and set up its sampling
        (its own generator: ``sampling.seed``, else a draw from the engine's ``rng``)."""
        check_request(request, vocab_size=vocab_size, max_len=max_seq_len,
                      limit="max_seq_len",
                      hint=" (engine option max_seq_len, capped by the model); shorten the "
                           "context or raise the option")
        prompt = list(request.prompt_ids)
        sp = request.sampling
        allowed = None if sp.allowed_token_ids is None else _allowed(sp.allowed_token_ids)
        seed = sp.seed if sp.seed is not None else rng.getrandbits(63)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(seed))
        loop = asyncio.get_running_loop()
        return cls(
            request=request,
            tokens=prompt,
            future=loop.create_future(),
            generator=gen,
            stop_ids=frozenset(sp.stop_token_ids) | eos,
            allowed=allowed,
        )

    def result(self, worker: str = "") -> GenerationResult:
        return GenerationResult(
            request_id=self.request.request_id,
            token_ids=list(self.out_ids),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=self.finish or "abort",
            recomputed=self.recomputed,
            worker=worker,
            kv_kept=self.kv_kept,
        )


_ALLOWED: dict[tuple[int, ...], torch.Tensor] = {}  # allowed ids -> their index tensor
_ALLOWED_MAX = 1024


def _allowed(ids: list[int]) -> torch.Tensor:
    """The sorted index tensor of ``ids``, one per distinct set (a constrained task's
    every request names the same few actions; the tensor is only read)."""
    key = tuple(ids)
    found = _ALLOWED.get(key)
    if found is None:
        if len(_ALLOWED) >= _ALLOWED_MAX:
            _ALLOWED.clear()
        found = _ALLOWED[key] = torch.tensor(sorted(set(ids)), dtype=torch.long)
    return found


@dataclass
class Idle:
    """A finished turn's KV kept for its trajectory's next request."""

    slot: int
    tokens: list[int]  # the tokens whose K/V are in the slot
    version: int


class SlotTable:
    """The runner's KV slots: free ones, and idle caches (trajectory id -> :class:`Idle`,
    least recently kept first)."""

    def __init__(self, slots: int) -> None:
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out the lowest
        self.idle: collections.OrderedDict[str, Idle] = collections.OrderedDict()
        self.evicted = 0

    def lookup(self, seq: Seq, version: int) -> tuple[Idle | None, int]:
        """The idle cache kept for ``seq``'s trajectory (or None), and how many leading
        tokens of ``seq`` it holds at weights ``version`` (at least one token is always
        computed: the last one's logits are needed)."""
        tid = seq.request.trajectory_id
        idle = self.idle.get(tid) if tid else None
        if idle is None or idle.version != version:
            return idle, 0
        n = min(len(idle.tokens), len(seq.tokens) - 1)
        return idle, (n if seq.tokens[:n] == idle.tokens[:n] else 0)

    def assign(self, seq: Seq, idle: Idle | None) -> None:
        """Give ``seq`` a slot: its trajectory's idle cache (from :meth:`lookup`) back,
        else a free slot."""
        if idle is not None:
            del self.idle[seq.request.trajectory_id]
            seq.slot = idle.slot
        else:
            seq.slot = self.take()

    def take(self) -> int:
        """The lowest free slot, else the least recently used idle cache's (evicted)."""
        if not self._free:  # evict the least recently used kept cache
            _, idle = self.idle.popitem(last=False)
            self.evicted += 1
            return idle.slot
        return self._free.pop()

    def free(self, slot: int) -> None:
        if slot >= 0:
            self._free.append(slot)
            self._free.sort(reverse=True)

    def keep(self, trajectory_id: str, slot: int, tokens: list[int], version: int) -> None:
        """Keep ``slot`` (K/V of ``tokens`` at ``version``) for the trajectory's next turn."""
        self.release(trajectory_id)
        self.idle[trajectory_id] = Idle(slot, tokens, version)

    def release(self, trajectory_id: str) -> bool:
        """Free the idle cache kept for ``trajectory_id``; True if there was one."""
        idle = self.idle.pop(trajectory_id, None) if trajectory_id else None
        if idle is None:
            return False
        self.free(idle.slot)
        return True

    def release_all(self) -> None:
        """Free every idle cache (a weight update made their K/V stale)."""
        for tid in list(self.idle):
            self.release(tid)
