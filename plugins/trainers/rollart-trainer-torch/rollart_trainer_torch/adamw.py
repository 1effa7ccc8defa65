"""AdamW for CPU parameters without ``torch.optim``: the same update, bit for bit.

Why: constructing a ``torch.optim.Optimizer`` and its first ``step`` import
``torch._dynamo`` (torch marks both as not-to-be-compiled), about 0.9 s of CPU on a 2-core
machine - 40 % of a small run's start-up once transformers is out of it (issue 12). For
CPU tensors torch runs its single-tensor loop (``foreach`` and ``fused`` default off on
the CPU); :class:`LeanAdamW` runs the same operations in the same order, keeps the same
state (``step`` as a float32 tensor, ``exp_avg``, ``exp_avg_sq``) and reads and writes
the same ``state_dict`` format, so checkpoints move between the two (the tests check the
weights bit for bit against ``torch.optim.AdamW`` and the state dicts both ways).

The trainer uses it for parameters on the CPU; on a GPU it uses ``torch.optim.AdamW``
(its foreach/fused kernels; the import is nothing there).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch

_DEFAULTS = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
             "differentiable": False, "fused": None, "decoupled_weight_decay": True}


class LeanAdamW:
    """``torch.optim.AdamW(params, lr, betas, eps, weight_decay)`` (no amsgrad, no
    maximize) for CPU tensors: ``param_groups``, ``state``, ``step``, ``zero_grad``,
    ``state_dict`` and ``load_state_dict`` as torch's."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float) -> None:
        group: dict[str, Any] = {"params": list(params), "lr": lr, "betas": tuple(betas),
                                 "eps": eps, "weight_decay": weight_decay, **_DEFAULTS}
        if any(p.device.type != "cpu" for p in group["params"]):
            raise ValueError("LeanAdamW is for CPU parameters; use torch.optim.AdamW on a GPU")
        self.param_groups = [group]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        # The update's denominator, written in place into a view of one buffer the size
        # of the largest parameter: torch's ``exp_avg_sq.sqrt() / c`` allocates two
        # parameter-sized temporaries per parameter per step, which a large model pays in
        # page faults (SmolLM2-135M: 0.5-1.5 s of a 2-3 s step went to its sqrt and div).
        self._scratch: dict[torch.dtype, torch.Tensor] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """torch's ``_single_tensor_adam`` with ``decoupled_weight_decay``, per parameter."""
        for group in self.param_groups:
            lr, (beta1, beta2) = group["lr"], group["betas"]
            eps, weight_decay = group["eps"], group["weight_decay"]
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state.get(param)
                if state is None:
                    state = self.state[param] = {
                        "step": torch.tensor(0.0, dtype=torch.float32),
                        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(param,
                                                       memory_format=torch.preserve_format),
                    }
                exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                step_t += 1
                if weight_decay != 0:
                    param.mul_(1 - lr * weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = step_t.item()
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                bias_correction2_sqrt = bias_correction2**0.5
                denom = self._denominator(exp_avg_sq)
                torch.sqrt(exp_avg_sq, out=denom)
                denom.div_(bias_correction2_sqrt).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)

    def _denominator(self, like: torch.Tensor) -> torch.Tensor:
        """A tensor shaped as ``like`` for the update's denominator: a view of the shared
        scratch buffer (grown to the largest parameter once), or its own for a
        non-contiguous ``like`` (the same values either way: the operations are torch's,
        in its order, only written in place)."""
        if not like.is_contiguous():
            return torch.empty_like(like, memory_format=torch.preserve_format)
        n = like.numel()
        buf = self._scratch.get(like.dtype)
        if buf is None or buf.numel() < n:
            largest = max(p.numel() for g in self.param_groups for p in g["params"]
                          if p.dtype == like.dtype)
            buf = self._scratch[like.dtype] = torch.empty(max(n, largest), dtype=like.dtype)
        return buf[:n].view(like.shape)

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: parameters numbered in group order."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict`` of this class or of ``torch.optim.AdamW``."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(own["params"])
                for g, own in zip(groups, self.param_groups, strict=True)):
            raise ValueError("loaded optimizer state has other parameter groups than this "
                             "model's (was it saved from a different architecture?)")
        by_id = {i: p for g, own in zip(groups, self.param_groups, strict=True)
                 for i, p in zip(g["params"], own["params"], strict=True)}
        self.state = {}
        for i, s in state_dict["state"].items():
            p = by_id[int(i)]
            self.state[p] = {
                "step": torch.as_tensor(s["step"], dtype=torch.float32).clone().reshape(()),
                "exp_avg": s["exp_avg"].to(p.dtype).clone(),
                "exp_avg_sq": s["exp_avg_sq"].to(p.dtype).clone(),
            }
        for g, own in zip(groups, self.param_groups, strict=True):
            for k, v in g.items():
                if k != "params":
                    own[k] = tuple(v) if k == "betas" else copy.deepcopy(v)
