"""Prefill-decode disaggregation in engine ``torch``: the K/V hand-off between engines.

``TorchEngine.prefill_kv(request)`` computes the K/V of a request's prompt (all but its
last token) in the batch like any request, samples nothing, frees its slot and hands the
K/V out as a :class:`KVHandoff`; ``generate(request, kv=handoff)`` on another engine
imports them into a slot and decodes from there. Sampling happens on the decode side only,
so a seeded request samples the same tokens with or without the hand-off. A hand-off from
another weights version, or for other tokens, is ignored: the prompt is computed there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollart_engine_torch.runner import SlotRunner
    from rollart_engine_torch.slots import Seq


@dataclass
class KVHandoff:
    """The K/V of ``tokens`` (positions ``0..n-1``) computed at weights ``version``.

    ``k`` and ``v`` are CPU tensors ``[layers, kv_heads, n, head_dim]``. Between Ray
    actors it travels through the object store (an ObjectRef passed as an argument)."""

    tokens: list[int]
    version: int
    k: Any
    v: Any


def usable(kv: KVHandoff | None, tokens: list[int], version: int) -> bool:
    """Decode side: ``kv`` was computed at this ``version`` for a prefix of ``tokens``
    (else it is stale or foreign, and the prompt is simply computed here)."""
    return kv is not None and kv.version == version and kv.tokens == tokens[: len(kv.tokens)]


def empty(runner: SlotRunner, version: int) -> KVHandoff:
    """No K/V (a one-token prompt, or an aborted prefill): the decode side computes all."""
    return KVHandoff([], version, *runner.export_slot(0, 0))


def import_pending(runner: SlotRunner, seqs: Iterable[Seq]) -> int:
    """Decode side, at the start of a step: copy each admitted sequence's hand-off into
    its slot. Returns the tokens thus served (not computed)."""
    reused = 0
    for seq in seqs:
        if seq.handoff is not None:
            runner.import_slot(seq.slot, seq.handoff.k, seq.handoff.v)
            seq.cached = len(seq.handoff.tokens)
            reused += seq.cached
            seq.handoff = None
    return reused


def export(runner: SlotRunner, seq: Seq) -> None:
    """Prefill side, after the step that computed ``seq``'s prefix: keep its K/V (the
    slot is freed when the sequence finishes)."""
    seq.exported = runner.export_slot(seq.slot, seq.cached)
    seq.finish = "stop"


def result(runner: SlotRunner, seq: Seq, version: int) -> KVHandoff:
    """What ``prefill_kv`` returns for ``seq``: its exported K/V, or an empty hand-off
    when it was aborted before its step."""
    if seq.exported is None:
        return empty(runner, version)
    k, v = seq.exported
    return KVHandoff(list(seq.tokens), version, k, v)
