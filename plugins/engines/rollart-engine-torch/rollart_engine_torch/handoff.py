"""Prefill-decode disaggregation in engine ``torch``: the K/V hand-off between engines.

``TorchEngine.prefill_kv(request)`` computes the K/V of a request's prompt (all but its
last token) in the batch like any request, samples nothing, keeps its slot (as any
trajectory's cache is kept for its next turn) and hands the K/V out as a
:class:`KVHandoff`; ``generate(request, kv=handoff)`` on another engine
imports them into a slot and decodes from there. Sampling happens on the decode side only,
so a seeded request samples the same tokens with or without the hand-off. A hand-off from
another weights version, or for other tokens, is ignored: the prompt is computed there.

Multi-turn trajectories keep their cache on both sides. The prefill engine keeps the K/V
it computed for a trajectory (like any engine with ``reuse_kv``), so its next turn
computes only the new tokens (the last action, the observation). The decode engine keeps
its own (its result's ``kv_kept`` says how many tokens); the LLMProxy passes that count to
the next ``prefill_kv`` as ``held``, and the hand-off then carries only the positions the
decode engine lacks (``KVHandoff.start`` onwards). The other way, at the trajectory's
next turn the LLMProxy asks the decode engine for the K/V of the answer it sampled
(``TorchEngine.export_kv``, :func:`kept`) and passes them to ``prefill_kv``: the prefill
engine imports them into its kept cache and computes only the observation. (Asked for at
the next turn, not handed out at every finish: a trajectory's last answer, often the
longest, is never copied.) An engine that no longer holds a hand-off's
``start`` tokens (its cache was evicted, or a weight update dropped it) ignores it and
computes what it lacks itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollart_engine_torch.runner import SlotRunner
    from rollart_engine_torch.slots import Idle, Seq


@dataclass
class KVHandoff:
    """The K/V of ``tokens[start:]`` (positions ``start..n-1``) computed at weights
    ``version``; the receiver must already hold the first ``start`` (its kept cache).

    ``k`` and ``v`` are CPU tensors ``[layers, kv_heads, n - start, head_dim]``. Between
    Ray actors it travels through the object store (an ObjectRef passed as an argument)."""

    tokens: list[int]  # the whole prefix (checked against the receiver's prompt)
    version: int
    k: Any
    v: Any
    start: int = 0

    @property
    def carried(self) -> int:
        """Positions whose K/V travel in this hand-off."""
        return len(self.tokens) - self.start


def usable(kv: KVHandoff | None, tokens: list[int], version: int) -> bool:
    """Decode side: ``kv`` was computed at this ``version`` for a prefix of ``tokens``
    (else it is stale or foreign, and the prompt is simply computed here)."""
    return kv is not None and kv.version == version and kv.tokens == tokens[: len(kv.tokens)]


def empty(runner: SlotRunner, version: int) -> KVHandoff:
    """No K/V (a one-token prompt, or an aborted prefill): the decode side computes all."""
    return KVHandoff([], version, *runner.export_slot(0, 0))


def import_pending(runner: SlotRunner, seqs: Iterable[Seq]) -> int:
    """Decode side, at the start of a step: copy each admitted sequence's hand-off into
    its slot, after what the slot already holds (a kept cache: admission checked that it
    covers the hand-off's ``start``). Returns the tokens thus served (not computed)."""
    reused = 0
    for seq in seqs:
        kv, seq.handoff = seq.handoff, None
        end = min(len(kv.tokens), len(seq.tokens) - 1) if kv is not None else 0
        if kv is None or end <= seq.cached or seq.cached < kv.start:
            continue  # (at least one token is computed: its logits are needed)
        a, b = seq.cached - kv.start, end - kv.start  # positions the slot lacks
        runner.import_slot(seq.slot, kv.k[:, :, a:b], kv.v[:, :, a:b], at=seq.cached)
        reused += end - seq.cached
        seq.cached = end
    return reused


def kept(runner: SlotRunner, idle: Idle, start: int) -> KVHandoff | None:
    """PD decode side: positions ``start..`` of a trajectory's kept cache (the answer it
    sampled, for the prefill engine that holds the first ``start``), or None when it
    holds nothing past them."""
    n = len(idle.tokens)
    if start >= n:
        return None
    return KVHandoff(list(idle.tokens), idle.version, *runner.export_slot(idle.slot, n, start),
                     start=start)


def export(runner: SlotRunner, seq: Seq) -> None:
    """Prefill side, after the step that computed ``seq``'s prefix: keep its K/V (the
    slot is kept or freed when the sequence finishes). Only the positions from
    ``seq.export_from`` (what the decode engine holds already) are exported."""
    seq.export_from = min(seq.export_from, seq.cached)
    seq.exported = runner.export_slot(seq.slot, seq.cached, seq.export_from)
    seq.finish = "stop"


def result(runner: SlotRunner, seq: Seq, version: int) -> KVHandoff:
    """What ``prefill_kv`` returns for ``seq``: its exported K/V, or an empty hand-off
    when it was aborted before its step."""
    if seq.exported is None:
        return empty(runner, version)
    k, v = seq.exported
    return KVHandoff(list(seq.tokens), version, k, v, start=seq.export_from)
