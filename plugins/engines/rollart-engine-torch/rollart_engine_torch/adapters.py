"""LoRA adapter payloads in engine ``torch`` (:mod:`rollart_sdk.weights.lora`).

A weight update may carry, instead of a weight ``W``, its adapter's factors
``W.lora_A`` / ``W.lora_B`` (scale folded into B): the engine then serves
``W = W0 + B @ A``. ``W0``, the base weight, is copied aside the first time an adapter for
``W`` arrives (the weights served then: the checkpoint's, or a full update's), so that
every later version is merged against the base again instead of on top of the previous
merge (no drift, no need for the previous version). A full tensor for ``W`` replaces its
base. The copies cost the adapted weights' memory once more.
"""

from __future__ import annotations

from typing import Any

import torch

from rollart_sdk.weights.lora import check_pair, merge, split_adapter


class AdapterMerger:
    """Base weights of the adapted parameters, and the merge of each update."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}  # weight name -> W0 (the served model's)

    def check(self, tensors: dict[str, Any], params: dict[str, torch.Tensor],
              check_full: Any) -> None:
        """Raise ValueError naming any tensor the served model cannot take: full tensors
        through ``check_full``, adapter pairs against the weight they adapt."""
        full, pairs = split_adapter(tensors)
        check_full(full)
        for weight, (a, b) in pairs.items():
            if weight not in params:
                raise ValueError(f"LoRA payload: {weight!r} is not a parameter of the served "
                                 "model; trainer and engine must serve the same model")
            check_pair(weight, a, b, tuple(params[weight].shape))

    @torch.no_grad()
    def assign(self, tensors: dict[str, Any], params: dict[str, torch.Tensor]) -> None:
        """Copy full tensors in (they become the base of an adapted weight) and set every
        adapted weight to its base plus ``B @ A``."""
        full, pairs = split_adapter(tensors)
        for name, t in full.items():
            value = t.to(device=params[name].device, dtype=params[name].dtype)
            params[name].copy_(value)
            if name in self.base:
                self.base[name] = value.clone()
        for weight, (a, b) in pairs.items():
            target = params[weight]
            if weight not in self.base:
                self.base[weight] = target.detach().clone()
            target.copy_(merge(self.base[weight], a, b))
