"""Sequence packing: variable-length trajectories concatenated into rows of at most
``pack_length`` tokens; rows of similar length stacked into micro-batches of at most
``max_tokens`` (rows x padded row length) and ``max_seqs`` trajectories.

Each trajectory keeps its own positions (0..n-1, so RoPE sees what it would see alone)
and attends only to its own earlier tokens (a block-diagonal causal mask). At a boundary
the last token of one trajectory "predicts" the first of the next; that prediction has
loss-mask 0 because a trajectory's first token is a prompt token (checked on input).
Padding at the end of a shorter row attends to nothing and has loss-mask 0.

The mask is an explicit ``[B, 1, L, L]`` boolean (True = masked), which Megatron's local
attention path applies on CPU and GPU alike; attention costs O(L^2) per row, hence rows
of moderate length rather than one long row. (On GPU with Transformer Engine, THD-format
``PackedSeqParams`` would avoid the dense mask; not implemented.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rollart_sdk.algorithms.policy import allowed_groups, policy_temperature
from rollart_sdk.types import TrainSample


@dataclass
class Packed:
    """One micro-batch: ``[B, L]`` tensors (B packed rows) plus the mask."""

    ids: torch.Tensor  # token ids (0 on padding)
    positions: torch.Tensor  # position within its own trajectory
    mask: torch.Tensor  # [B, 1, L, L] bool, True where attention is not allowed
    loss_mask: torch.Tensor  # float
    behaviour: torch.Tensor  # float
    versions: torch.Tensor  # long
    advantages: torch.Tensor  # float: the trajectory's advantage on its tokens
    seq_weight: torch.Tensor  # float: 1 / (loss tokens of its trajectory)
    trajectories: int
    # The sampled policy of each token's trajectory (rollart_sdk.algorithms.policy): its
    # temperature (1 on padding) and allowed-ids group (-1: unconstrained), and the groups'
    # id sets.
    temperature: torch.Tensor | None = None  # float
    group: torch.Tensor | None = None  # long
    allowed: list[torch.Tensor] = field(default_factory=list)


def plan_rows(lengths: list[int], pack_length: int) -> list[list[int]]:
    """First-fit decreasing: indexes of the trajectories of each row (at most
    ``pack_length`` tokens; a longer trajectory gets a row of its own). Rows come out
    longest first. Deterministic for equal inputs."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(pack_length - lengths[i])
    used = [sum(lengths[i] for i in row) for row in rows]
    return [rows[r] for r in sorted(range(len(rows)), key=lambda r: (-used[r], r))]


def plan_micro_batches(lengths: list[int], pack_length: int, max_tokens: int,
                       max_seqs: int | None = None) -> list[list[list[int]]]:
    """Rows (``plan_rows``) grouped into micro-batches: consecutive rows while
    rows x longest row <= ``max_tokens`` and trajectories <= ``max_seqs`` (a row
    alone always forms a micro-batch)."""
    out: list[list[list[int]]] = []
    for row in plan_rows(lengths, pack_length):
        n = sum(lengths[i] for i in row)
        if out:
            cur = out[-1]
            longest = max(sum(lengths[i] for i in r) for r in cur)  # rows come longest first
            seqs = sum(len(r) for r in cur) + len(row)
            if (len(cur) + 1) * max(longest, n) <= max_tokens and (
                max_seqs is None or seqs <= max_seqs
            ):
                cur.append(row)
                continue
        out.append([row])
    return out


def pack(rows: list[list[TrainSample]]) -> Packed:
    """Build one micro-batch from rows of samples (advantages must be filled)."""
    width = max(sum(len(s.input_ids) for s in row) for row in rows)
    b = len(rows)
    ids = torch.zeros((b, width), dtype=torch.long)
    pos = torch.zeros((b, width), dtype=torch.long)
    lm = torch.zeros((b, width), dtype=torch.float32)
    beh = torch.zeros((b, width), dtype=torch.float32)
    ver = torch.zeros((b, width), dtype=torch.long)
    adv = torch.zeros((b, width), dtype=torch.float32)
    sw = torch.zeros((b, width), dtype=torch.float32)
    mask = torch.ones((b, 1, width, width), dtype=torch.bool)
    temp = torch.ones((b, width), dtype=torch.float32)
    grp = torch.full((b, width), -1, dtype=torch.long)
    groups, allowed = allowed_groups([s.allowed_token_ids for row in rows for s in row])
    k = 0
    for r, row in enumerate(rows):
        start = 0
        for s in row:
            n = len(s.input_ids)
            sl = slice(start, start + n)
            ids[r, sl] = torch.tensor(s.input_ids, dtype=torch.long)
            pos[r, sl] = torch.arange(n)
            lm[r, sl] = torch.tensor(s.loss_mask, dtype=torch.float32)
            beh[r, sl] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            ver[r, sl] = torch.tensor(s.token_versions, dtype=torch.long)
            adv[r, sl] = float(s.advantage or 0.0)
            masked = sum(s.loss_mask[1:])
            sw[r, sl] = 1.0 / masked if masked else 0.0
            mask[r, 0, sl, sl] = torch.triu(torch.ones((n, n), dtype=torch.bool), diagonal=1)
            temp[r, sl] = policy_temperature(s.temperature)
            grp[r, sl] = groups[k]
            k += 1
            start += n
    return Packed(ids=ids, positions=pos, mask=mask, loss_mask=lm, behaviour=beh,
                  versions=ver, advantages=adv, seq_weight=sw,
                  trajectories=sum(len(r) for r in rows),
                  temperature=temp if bool((temp != 1.0).any()) else None,
                  group=grp if allowed else None, allowed=allowed)
