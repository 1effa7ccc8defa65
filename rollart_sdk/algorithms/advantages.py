"""Group-relative advantages (GRPO).

For the trajectories ``i`` of one group ``g`` (same prompt / environment seed)::

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)      normalize_std=True  (GRPO)
    A_i =  r_i - mean_g(r)                          normalize_std=False (Dr. GRPO)

``std_g`` is the sample standard deviation (Bessel-corrected, as in TRL and verl).
A group whose rewards are all equal carries no learning signal: its advantages are
exactly 0 (not ``0/eps`` noise from rounding in the mean), and so is a group of one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from rollart_sdk.types import TrainSample


def _group_index(group_ids: torch.Tensor | Sequence[Hashable]) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids (strings, ints, a tensor) to dense indices 0..G-1."""
    if isinstance(group_ids, torch.Tensor):
        keys: list[Hashable] = group_ids.tolist()
    else:
        keys = list(group_ids)
    dense: dict[Hashable, int] = {}
    idx = [dense.setdefault(k, len(dense)) for k in keys]
    return torch.tensor(idx, dtype=torch.long), len(dense)


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> torch.Tensor:
    """Per-trajectory advantages from scalar rewards, normalised within each group.

    ``rewards``: float tensor ``[N]``; ``group_ids``: ``N`` hashable ids (or an int
    tensor). Returns a float tensor ``[N]`` on the rewards' device.
    """
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float64)  # group sums in float64: exact zeros for equal rewards
    index, n_groups = _group_index(group_ids)
    if index.numel() != r.numel():
        raise ValueError(f"{r.numel()} rewards but {index.numel()} group ids")
    index = index.to(r.device)
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(
        0, index, torch.ones_like(r)
    )
    mean = torch.zeros_like(count).index_add_(0, index, r) / count
    centred = r - mean[index]
    # Equal rewards (max == min) or a single member: no signal, exactly zero.
    g_max = torch.full_like(count, -torch.inf).scatter_reduce(0, index, r, reduce="amax")
    g_min = torch.full_like(count, torch.inf).scatter_reduce(0, index, r, reduce="amin")
    flat = (g_max == g_min)[index]
    if normalize_std:
        sq = torch.zeros_like(count).index_add_(0, index, centred * centred)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        adv = centred / (std[index] + eps)
    else:
        adv = centred
    adv = torch.where(flat, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def fill_advantages(
    batch: list[TrainSample], eps: float = 1e-6, normalize_std: bool = True
) -> list[TrainSample]:
    """Set ``advantage`` (in place) on every sample where it is None, by GRPO over the
    whole ``batch``; returns ``batch``.

    Call this where the full batch is known, before sharding it over data-parallel
    ranks: group statistics computed on a shard would be wrong (a group split across
    ranks). Samples that already carry an advantage keep it; their rewards still count
    towards their group's mean and std.

    A trajectory of several segments (``segment`` > 0: an agent episode whose history was
    rewritten) is one member of its group: its segment 0 counts in the statistics and its
    other segments take segment 0's advantage.
    """
    if not batch or all(s.advantage is not None for s in batch):
        return batch
    members = [s for s in batch if s.segment == 0]
    rewards = torch.tensor([float(s.reward) for s in members], dtype=torch.float64)
    adv = grpo_advantages(rewards, [s.group_id for s in members], eps, normalize_std)
    for s, a in zip(members, adv.tolist(), strict=True):
        if s.advantage is None:
            s.advantage = float(a)
    if len(members) < len(batch):
        of = {s.trajectory_id: s.advantage for s in members}
        for s in batch:
            if s.segment and s.advantage is None:
                if s.trajectory_id not in of:
                    raise ValueError(f"segment {s.segment} of trajectory {s.trajectory_id!r} "
                                     "is in the batch without its segment 0")
                s.advantage = of[s.trajectory_id]
    return batch
