"""The distributed optimizer of trainer ``megatron``: AdamW state sharded over the
data-parallel group, as megatron-core's ``DistributedOptimizer`` shards it (ZeRO-1).

Megatron's own class cannot be used on CPU: it type-checks parameters against
``'torch.cuda.FloatTensor'`` and allocates its loss-scale and overflow tensors with
``device='cuda'`` (``optimizer.py``, ``distrib_optimizer.py`` of megatron-core 0.16), and
it needs Megatron's DDP wrapper, whose gradient buffers use CUDA streams. This module does
the same job on any device and backend (gloo included):

- the local parameters (this rank's TP / PP shards) are viewed as one flat vector of
  ``N`` elements, padded to a multiple of ``dp``; data-parallel rank ``d`` owns the
  contiguous range ``[d * S, (d + 1) * S)``, ``S = ceil(N / dp)``;
- gradients are **reduce-scattered** over the DP group (each rank receives the summed
  gradient of its range only);
- the global gradient norm is the sum of every rank's squared range norm over the DP group
  and the model-parallel group (TP-replicated parameters counted on TP rank 0 only, as in
  the non-distributed path), then the range is clipped;
- ``torch.optim.AdamW`` steps a float32 master copy of the range (``master_weights``,
  on by default; off: a copy in the parameters' dtype): ``exp_avg`` and ``exp_avg_sq``
  exist for ``S`` elements per rank, about ``1/dp`` of the model; with master weights the
  gradients are reduce-scattered in float32 and divided by the loss scale (float16) there;
- the updated ranges are **all-gathered** over the DP group and copied into the parameters.

AdamW is elementwise, so this gives the same update as AdamW over whole parameters (the
tests compare against the non-distributed optimizer after several steps).
Checkpoints gather the moments into whole parameters (:meth:`full_moments`) and scatter
them back on load (:meth:`load_full_moments`), like Megatron's ``dp_zero_gather_scatter``
format, so a checkpoint does not depend on the DP size; the fp32 masters likewise
(:meth:`full_masters`, :meth:`load_full_masters`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from rollart_sdk.backends.master_weights import LossScaler, scale_of, scaled


class DistributedAdamW:
    """AdamW over ``params`` with its state sharded over ``dp_group``.

    ``counted[i]`` says whether parameter ``i`` enters the global grad norm on this rank
    (False for a copy another rank of the model-parallel group also counts).
    ``norm_groups``: the model-parallel groups the squared norm is summed over, besides
    the DP group.
    """

    def __init__(self, params: list[torch.Tensor], counted: list[bool], dp_group: Any,
                 norm_groups: list[Any], *, lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float, master_weights: bool = True,
                 scaler: LossScaler | None = None) -> None:
        self.params = params
        self.dp_group = dp_group
        self.norm_groups = [g for g in norm_groups if dist.get_world_size(g) > 1]
        self.dp = dist.get_world_size(dp_group)
        self.dp_rank = dist.get_rank(dp_group)
        self.numel = sum(p.numel() for p in params)
        self.shard = -(-self.numel // self.dp)
        self.lo = min(self.dp_rank * self.shard, self.numel)
        self.hi = min(self.lo + self.shard, self.numel)
        device = params[0].device
        weights = torch.cat([torch.full((p.numel(),), float(c), dtype=torch.float64)
                             for p, c in zip(params, counted, strict=True)])
        self._norm_weight = weights[self.lo : self.hi].to(device)
        self.master_weights = master_weights
        self.main_dtype = torch.float32 if master_weights else params[0].dtype
        self.main = torch.nn.Parameter(
            self._flat_params()[self.lo : self.hi].to(self.main_dtype, copy=True))
        self.inner = torch.optim.AdamW([self.main], lr=lr, betas=betas, eps=eps,
                                       weight_decay=weight_decay)
        self.scaler = scaler

    # ------------------------------------------------------------------ optimiser API

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None if set_to_none else (p.grad.zero_() if p.grad is not None else None)

    @property
    def loss_scale(self) -> float:
        """The scale the next backward uses (1.0 without scaling)."""
        return scale_of(self.scaler)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return scaled(loss, self.scaler)

    def state_numel(self) -> int:
        """Elements of AdamW state held on this rank (``exp_avg`` + ``exp_avg_sq``)."""
        st = self.inner.state.get(self.main, {})
        return sum(st[k].numel() for k in ("exp_avg", "exp_avg_sq") if k in st)

    def step(self, max_norm: float) -> tuple[float, bool]:
        """Reduce-scatter the gradients, global norm, clip, AdamW on this rank's range,
        all-gather the parameters. Returns (grad norm, skipped: non-finite norm)."""
        grad = self._reduce_scatter_grads()
        if self.loss_scale != 1.0:
            grad.mul_(1.0 / self.loss_scale)
        sq = (grad.double().pow(2) * self._norm_weight).sum().reshape(1)
        for group in [self.dp_group, *self.norm_groups]:
            if dist.get_world_size(group) > 1:
                dist.all_reduce(sq, group=group)
        total = float(sq[0].sqrt())
        if self.scaler is not None:  # every rank sees the same total: they agree
            self.scaler.update(math.isfinite(total))
        if not math.isfinite(total):  # a non-finite gradient would poison the moments
            return total, True
        if total > max_norm:
            grad.mul_(max_norm / (total + 1e-6))
        self.main.grad = grad.to(self.main.dtype)
        self.inner.step()
        self.main.grad = None
        self._all_gather_params()
        return total, False

    # ------------------------------------------------------------------ checkpoints

    @property
    def adam_step(self) -> float:
        st = self.inner.state.get(self.main)
        return float(st["step"]) if st else 0.0

    def full_moments(self) -> dict[str, list[torch.Tensor]] | None:
        """``exp_avg`` / ``exp_avg_sq`` of every local parameter, whole (gathered over the
        DP group; collective). ``None`` before the first step."""
        st = self.inner.state.get(self.main)
        have = torch.tensor([1.0 if st else 0.0])
        if self.dp > 1:
            dist.all_reduce(have, op=dist.ReduceOp.MIN, group=self.dp_group)
        if not have[0] or st is None:  # the same on every rank: have is their minimum
            return None
        out = {}
        for key in ("exp_avg", "exp_avg_sq"):  # in the range's dtype (fp32 with masters)
            flat = self._gather(st[key])
            out[key] = [t.view_as(p) for t, p in zip(self._split(flat), self.params,
                                                     strict=True)]
        return out

    def full_masters(self) -> list[torch.Tensor]:
        """The master copy of every local parameter, whole (gathered over the DP group;
        collective)."""
        flat = self._gather(self.main.detach())
        return [t.view_as(p) for t, p in zip(self._split(flat), self.params, strict=True)]

    def load_full_masters(self, masters: list[torch.Tensor]) -> None:
        """Take this rank's range of whole-parameter masters (the inverse of
        :meth:`full_masters`); the parameters take them rounded."""
        flat = torch.cat([t.reshape(-1).to(self.main_dtype) for t in masters])
        with torch.no_grad():
            self.main.data.copy_(flat[self.lo : self.hi].to(self.main.device))
            for p, t in zip(self.params, masters, strict=True):
                p.copy_(t.view_as(p))

    def load_full_moments(self, moments: dict[str, list[torch.Tensor]], step: float) -> None:
        """Take this rank's range of whole-parameter moments (the inverse of
        :meth:`full_moments`) and AdamW's step count."""
        state = {"step": torch.tensor(float(step))}
        for key, tensors in moments.items():
            flat = torch.cat([t.reshape(-1).to(self.main_dtype) for t in tensors])
            state[key] = flat[self.lo : self.hi].to(self.main.device).clone()
        self.inner.state[self.main] = state
        self.main.data.copy_(self._flat_params()[self.lo : self.hi])

    def sync_master(self) -> None:
        """Refresh the master range from the parameters (after they were loaded)."""
        with torch.no_grad():
            self.main.data.copy_(self._flat_params()[self.lo : self.hi])

    # ------------------------------------------------------------------ internals

    def _flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(flat[: self.numel], [p.numel() for p in self.params]))

    def _padded(self, flat: torch.Tensor) -> torch.Tensor:
        pad = self.shard * self.dp - flat.numel()
        return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat

    def _reduce_scatter_grads(self) -> torch.Tensor:
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          .to(self.main_dtype) for p in self.params])
        if self.dp == 1:
            return flat[self.lo : self.hi].clone()
        out = flat.new_empty(self.shard)
        dist.reduce_scatter_tensor(out, self._padded(flat), group=self.dp_group)
        return out[: self.hi - self.lo]

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        if self.dp == 1:
            return local
        part = local.new_zeros(self.shard)
        part[: local.numel()] = local
        full = local.new_empty(self.shard * self.dp)
        dist.all_gather_into_tensor(full, part, group=self.dp_group)
        return full

    def _all_gather_params(self) -> None:
        full = self._gather(self.main.detach())
        with torch.no_grad():
            for p, t in zip(self.params, self._split(full), strict=True):
                p.copy_(t.view_as(p))
