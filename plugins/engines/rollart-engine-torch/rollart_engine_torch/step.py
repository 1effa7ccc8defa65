"""One engine step of engine ``torch`` (it runs in a worker thread; the command loop
waits for it, so the batch is never changed under it).

One batched forward in which every running sequence feeds the tokens of its context that
are not in its KV slot yet (a prompt, a new observation, or its last sampled token) and
samples one token:

- hand-offs (prefill-decode disaggregation) of newly admitted sequences are imported
  into their slots first (:mod:`rollart_engine_torch.handoff`);
- rows with the same tokens and the same cached length (a group's shared prompt;
  multi-turn episodes that took the same actions so far) are computed once: the others
  copy the new K/V into their slots and sample, each with its own generator, from the
  same logits;
- the rows' tokens go flat through the forward (no padding: a long prompt costs the
  one-token decodes beside it nothing, :meth:`SlotRunner.extend`);
- each token is recorded with its logprob under the sampled policy (allowed-ids mask and
  temperature, :mod:`rollart_engine_torch.sampling`) and the weights version that
  produced it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rollart_engine_torch import handoff
from rollart_engine_torch.runner import SlotRunner
from rollart_engine_torch.sampling import choose_token
from rollart_engine_torch.slots import Seq


@dataclass
class StepCounts:
    """The engine's token and step counters (``TorchEngine.stats``)."""

    tokens_generated: int = 0
    prefill_tokens: int = 0  # tokens computed besides the one-per-step decode token
    reused_tokens: int = 0  # prompt tokens served from a kept cache or a hand-off (not computed)
    shared_tokens: int = 0  # prefill tokens copied from an identical row of a step
    handoff_out: int = 0  # PD prefill side: K/V positions exported in hand-offs
    steps: int = 0
    recompute_s: float = 0.0  # forward time spent rebuilding KV after weight updates


def run_step(runner: SlotRunner, running: list[Seq], version: int,
             counts: StepCounts) -> list[Seq]:
    """One batched forward over every running sequence's uncached tokens, one sampled
    token each. Returns the sequences that finished; ``counts`` is updated."""
    finished: list[Seq] = []
    counts.reused_tokens += handoff.import_pending(runner, running)
    # Rows with the same tokens and the same cached length (a group's shared prompt;
    # multi-turn episodes that took the same actions so far) are computed once: the
    # others copy the new K/V into their slots and sample from the same logits.
    same: dict[tuple[int, tuple[int, ...]], Seq] = {}
    copies: list[tuple[Seq, Seq]] = []  # (copy, computed row)
    computed: list[Seq] = []
    for seq in running:
        key = (seq.cached, tuple(seq.tokens))
        first = None if seq.prefill_only else same.setdefault(key, seq)
        if first is None or first is seq:
            computed.append(seq)
        else:
            copies.append((seq, first))
    row_of: dict[int, tuple[torch.Tensor | None, int]] = {}
    if computed:
        chunks = [s.tokens[s.cached :] for s in computed]
        t0 = time.perf_counter()
        logits = runner.extend([s.slot for s in computed], chunks,
                               [s.cached for s in computed],
                               logits=not all(s.prefill_only for s in computed))
        rebuilt = sum(len(c) for s, c in zip(computed, chunks, strict=True) if s.recomputing)
        if rebuilt:  # weight-sync cost: the forward's share spent rebuilding KV
            counts.recompute_s += (time.perf_counter() - t0) * rebuilt / sum(map(len, chunks))
        # A sampling row's last fed token is its decode token; a PD prefill row has none.
        counts.prefill_tokens += (sum(len(c) for c in chunks)
                                  - sum(not s.prefill_only for s in computed))
        for row, seq in enumerate(computed):
            row_of[id(seq)] = (logits, row)
    for seq, first in copies:
        runner.copy_slot(first.slot, seq.slot, seq.cached, len(seq.tokens))
        counts.shared_tokens += len(seq.tokens) - seq.cached - 1  # as prefill_tokens
        row_of[id(seq)] = row_of[id(first)]
    for seq in running:
        logits, row = row_of[id(seq)]
        seq.cached = len(seq.tokens)
        seq.recomputing = False
        if seq.prefill_only:
            handoff.export(runner, seq)
            counts.handoff_out += seq.cached - seq.export_from
            finished.append(seq)
        elif append_token(seq, logits[row], version, runner.max_seq_len, counts):  # type: ignore[index]
            finished.append(seq)
    counts.steps += 1
    return finished


def append_token(seq: Seq, logits: torch.Tensor, version: int, max_seq_len: int,
                 counts: StepCounts) -> bool:
    """Sample, record the token with its policy logprob; True when seq is done."""
    params = seq.request.sampling
    assert seq.generator is not None
    tok, logprob = choose_token(logits, params, seq.generator, seq.allowed)
    seq.tokens.append(tok)
    seq.out_ids.append(tok)
    seq.logprobs.append(logprob)
    seq.versions.append(version)
    counts.tokens_generated += 1
    if tok in seq.stop_ids:
        seq.finish = "stop"
    elif len(seq.out_ids) >= params.max_new_tokens or len(seq.tokens) >= max_seq_len:
        seq.finish = "length"
    return seq.finish is not None
