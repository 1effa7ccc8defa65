"""Group-relative advantages: GRPO, RLOO and REINFORCE++ with a group baseline.

For the trajectories ``i`` of one group ``g`` (same prompt / environment seed), ``n_g``
members, estimator (trainer option ``adv_estimator``)::

    grpo:   A_i = (r_i - mean_g(r)) / (std_g(r) + eps)   normalize_std=True  (GRPO)
            A_i =  r_i - mean_g(r)                       normalize_std=False (Dr. GRPO)
    rloo:   A_i =  r_i - mean_{j != i in g}(r_j)  =  n_g / (n_g - 1) * (r_i - mean_g(r))
    reinforce_pp_baseline:
            c_i =  r_i - mean_g(r), then whitened over the whole batch's trained tokens:
            A_i = (c_i - mu) / sqrt(var + 1e-8), mu and var the token-weighted mean and
            (Bessel-corrected) variance of c over every trained token (each trajectory's
            c_i counted once per token it trains: REINFORCE++-baseline as verl computes it)

``std_g`` is the sample standard deviation (Bessel-corrected, as in TRL and verl). For
``grpo`` and ``rloo`` a group whose rewards are all equal carries no learning signal: its
advantages are exactly 0 (not ``0/eps`` noise from rounding in the mean), and so is a group
of one. ``reinforce_pp_baseline`` centres such a group at 0 too, and the batch whitening
then shifts it with the rest (as verl does).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

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


ESTIMATORS = ("grpo", "rloo", "reinforce_pp_baseline")
Estimator = Literal["grpo", "rloo", "reinforce_pp_baseline"]
WHITEN_EPS = 1e-8  # verl's masked_whiten


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    eps: float = 1e-6,
    normalize_std: bool = True,
    estimator: Estimator = "grpo",
    tokens: torch.Tensor | Sequence[int] | None = None,
) -> torch.Tensor:
    """Per-trajectory advantages from scalar rewards, relative to each group (module doc).

    ``rewards``: float tensor ``[N]``; ``group_ids``: ``N`` hashable ids (or an int
    tensor); ``tokens``: the trained tokens of each (``reinforce_pp_baseline`` weighs its
    batch whitening by them; None: one each). Returns a float tensor ``[N]`` on the
    rewards' device.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; one of {ESTIMATORS}")
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
    if estimator == "rloo":  # each member's baseline is the mean of the others
        adv = centred * (count / (count - 1).clamp(min=1))[index]
    elif estimator == "grpo" and normalize_std:
        sq = torch.zeros_like(count).index_add_(0, index, centred * centred)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        adv = centred / (std[index] + eps)
    else:
        adv = centred
    adv = torch.where(flat, torch.zeros_like(adv), adv)
    if estimator == "reinforce_pp_baseline":
        adv = _whiten(adv, tokens)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def _whiten(x: torch.Tensor, tokens: torch.Tensor | Sequence[int] | None) -> torch.Tensor:
    """``x`` whitened with the mean and unbiased variance of the values it takes over
    all trained tokens (value ``x_i`` on ``tokens[i]`` tokens); unchanged when there are
    fewer than two tokens."""
    w = (torch.ones_like(x) if tokens is None
         else torch.as_tensor(tokens, dtype=x.dtype, device=x.device))
    if w.numel() != x.numel():
        raise ValueError(f"{x.numel()} advantages but {w.numel()} token counts")
    total = w.sum()
    if total <= 1:
        return x
    mean = (w * x).sum() / total
    var = (w * (x - mean) ** 2).sum() / (total - 1)
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS)


def fill_advantages(
    batch: list[TrainSample], eps: float = 1e-6, normalize_std: bool = True,
    estimator: Estimator = "grpo", tokens: Sequence[int] | None = None,
) -> list[TrainSample]:
    """Set ``advantage`` (in place) on every sample where it is None, by ``estimator``
    (module doc) over the whole ``batch``; returns ``batch``. ``tokens``: each sample's
    trained tokens, when its ``loss_mask`` is not there (None: counted from it).

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
    trained = None
    if estimator == "reinforce_pp_baseline":  # a trajectory's tokens over its segments
        counts = tokens if tokens is not None else [sum(s.loss_mask) for s in batch]
        per: dict[Hashable, int] = {}
        keys = [s.trajectory_id or ("sample", i) for i, s in enumerate(batch)]  # no id: alone
        for key, n in zip(keys, counts, strict=True):
            per[key] = per.get(key, 0) + int(n)
        trained = [per[k] for k, s in zip(keys, batch, strict=True) if s.segment == 0]
    adv = grpo_advantages(rewards, [s.group_id for s in members], eps, normalize_std,
                          estimator, trained)
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
