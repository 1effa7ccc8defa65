"""LoRA adapter payloads: a weight update that carries low-rank factors, not weights.

A trainer that trains LoRA adapters (trainer ``torch`` with ``trainer.options.lora``)
publishes, for every adapted linear layer whose weight is ``W`` (its full-model name, e.g.
``model.layers.0.self_attn.q_proj.weight``), two tensors through the ordinary transport
protocol (buckets, checksums, manifest, all-or-nothing commit)::

    <W>.lora_A   [rank, in_features]
    <W>.lora_B   [out_features, rank]   already multiplied by the scale alpha / rank

and the engine serves ``W = W0 + lora_B @ lora_A``, where ``W0`` is the base model's weight
(the checkpoint the engine was started from). Each update carries the whole adapter, not a
difference from the previous one, so an engine re-merges against ``W0`` at every version,
a restarted engine needs nothing but the newest version, and weights other than adapters'
never change. A bucket may mix full tensors and adapter pairs; a full tensor of an adapted
weight replaces ``W0``.

The helpers here are engine-agnostic (torch imported lazily): :func:`is_adapter_name`,
:func:`split_adapter` (pair up the factors, checking names and shapes) and :func:`merge`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

A_SUFFIX = ".lora_A"
B_SUFFIX = ".lora_B"


def adapter_names(weight: str) -> tuple[str, str]:
    """The payload names of the factors of the weight named ``weight``."""
    return weight + A_SUFFIX, weight + B_SUFFIX


def is_adapter_name(name: str) -> bool:
    return name.endswith(A_SUFFIX) or name.endswith(B_SUFFIX)


def split_adapter(tensors: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """``tensors`` as (full tensors, ``{weight name: (A, B)}``).

    Raises ``ValueError`` naming the weight when a factor comes without its partner or the
    two do not multiply (``B`` is ``[out, r]``, ``A`` is ``[r, in]``)."""
    full: dict[str, Any] = {}
    factors: dict[str, dict[str, Any]] = {}
    for name, t in tensors.items():
        for suffix in (A_SUFFIX, B_SUFFIX):
            if name.endswith(suffix):
                factors.setdefault(name[: -len(suffix)], {})[suffix] = t
                break
        else:
            full[name] = t
    pairs: dict[str, tuple[Any, Any]] = {}
    for weight, f in factors.items():
        if len(f) != 2:
            missing = B_SUFFIX if A_SUFFIX in f else A_SUFFIX
            raise ValueError(f"LoRA payload: {weight}{missing} is missing (each adapted weight "
                             f"needs both {A_SUFFIX} and {B_SUFFIX} in the same version)")
        a, b = f[A_SUFFIX], f[B_SUFFIX]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0]:
            raise ValueError(f"LoRA payload: {weight}: lora_B {list(b.shape)} @ lora_A "
                             f"{list(a.shape)} is not a matrix product ([out, r] @ [r, in])")
        pairs[weight] = (a, b)
    return full, pairs


def check_pair(weight: str, a: Any, b: Any, shape: tuple[int, ...] | list[int]) -> None:
    """Raise ``ValueError`` unless ``B @ A`` has the served weight's ``shape``."""
    want = [int(x) for x in shape]
    got = [int(b.shape[0]), int(a.shape[1])]
    if got != want:
        raise ValueError(f"LoRA payload: {weight}: lora_B @ lora_A is {got}, the served "
                         f"model's weight is {want} (trainer and engine must serve the same "
                         "model)")


def merge(base: Any, a: Any, b: Any) -> Any:
    """``base + b @ a`` computed in float32, returned in ``base``'s dtype and device."""
    delta = b.to(base.device, dtype=_f32()) @ a.to(base.device, dtype=_f32())
    return (base.to(_f32()) + delta).to(base.dtype)


def _f32() -> Any:
    import torch

    return torch.float32
