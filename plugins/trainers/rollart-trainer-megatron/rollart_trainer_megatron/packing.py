"""Sequence packing: variable-length trajectories concatenated into rows of at most
``max_tokens`` tokens, one row per micro-batch, no padding.

Each trajectory keeps its own positions (0..n-1, so RoPE sees what it would see alone)
and attends only to its own earlier tokens (a block-diagonal causal mask). At a boundary
the last token of one trajectory "predicts" the first of the next; that prediction has
loss-mask 0 because a trajectory's first token is a prompt token (checked on input).

The mask is an explicit ``[1, 1, S, S]`` boolean (True = masked), which Megatron's local
attention path applies on CPU and GPU alike; it costs O(S^2) per row. (On GPU with
Transformer Engine, THD-format ``PackedSeqParams`` would avoid it; not implemented.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollart_sdk.types import TrainSample


@dataclass
class PackedRow:
    """One micro-batch: ``[1, S]`` tensors plus per-token bookkeeping."""

    ids: torch.Tensor  # [1, S] token ids
    positions: torch.Tensor  # [1, S] position within its own trajectory
    mask: torch.Tensor  # [1, 1, S, S] bool, True where attention is not allowed
    loss_mask: torch.Tensor  # [1, S] float
    behaviour: torch.Tensor  # [1, S] float
    versions: torch.Tensor  # [1, S] long
    advantages: torch.Tensor  # [1, S] float: the trajectory's advantage on its tokens
    seq_weight: torch.Tensor  # [1, S] float: 1 / (masked tokens of its trajectory)
    lengths: list[int]


def plan_rows(lengths: list[int], max_tokens: int,
              max_seqs: int | None = None) -> list[list[int]]:
    """First-fit decreasing: indexes of the trajectories of each row (at most
    ``max_tokens`` tokens and ``max_seqs`` trajectories); a trajectory longer than
    ``max_tokens`` gets a row of its own. Deterministic for equal inputs."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if lengths[i] <= free and (max_seqs is None or len(rows[r]) < max_seqs):
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(max_tokens - lengths[i])
    return rows


def pack(samples: list[TrainSample]) -> PackedRow:
    """Concatenate ``samples`` into one row (advantages must be filled)."""
    lengths = [len(s.input_ids) for s in samples]
    total = sum(lengths)
    ids, pos, lm, beh, ver, adv, sw = [], [], [], [], [], [], []
    mask = torch.ones((total, total), dtype=torch.bool)
    start = 0
    for s, n in zip(samples, lengths, strict=True):
        ids += s.input_ids
        pos += range(n)
        lm += s.loss_mask
        beh += s.behaviour_logprobs
        ver += s.token_versions
        adv += [float(s.advantage or 0.0)] * n
        masked = sum(s.loss_mask[1:])
        sw += [1.0 / masked if masked else 0.0] * n
        mask[start : start + n, start : start + n] = torch.triu(
            torch.ones((n, n), dtype=torch.bool), diagonal=1
        )
        start += n
    return PackedRow(
        ids=torch.tensor([ids], dtype=torch.long),
        positions=torch.tensor([list(pos)], dtype=torch.long),
        mask=mask.view(1, 1, total, total),
        loss_mask=torch.tensor([lm], dtype=torch.float32),
        behaviour=torch.tensor([beh], dtype=torch.float32),
        versions=torch.tensor([ver], dtype=torch.long),
        advantages=torch.tensor([adv], dtype=torch.float32),
        seq_weight=torch.tensor([sw], dtype=torch.float32),
        lengths=lengths,
    )
