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


class CheckpointBase:
    """``W0`` by name from a checkpoint folder's safetensors files (memory-mapped, read on
    demand): the base an engine that cannot keep its own copy (vLLM, SGLang: the weights
    live in another process) merges adapters against. A model with tied word embeddings
    that stores no ``lm_head.weight`` gives the embedding for it."""

    def __init__(self, path: str) -> None:
        import json
        import struct
        from pathlib import Path

        self.path = path
        self._files: dict[str, str] = {}
        for f in sorted(Path(path).glob("*.safetensors")):
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            self._files.update({k: str(f) for k in header if k != "__metadata__"})
        embed = "model.embed_tokens.weight"
        if "lm_head.weight" not in self._files and embed in self._files:
            self._files["lm_head.weight"] = self._files[embed]
            self._alias = {"lm_head.weight": embed}
        else:
            self._alias = {}

    def siblings(self, weight: str) -> list[str]:
        """Every tensor of the checkpoint in the module that holds ``weight`` (``q_proj``'s
        are its attention block's: q, k, v, o...): what an engine that fuses layers (vLLM's
        ``qkv_proj``, ``gate_up_proj``) must receive together."""
        parent = weight.rsplit(".", 2)[0] + "."
        return sorted(n for n in self._files if n.startswith(parent))

    def __call__(self, name: str) -> Any:
        from safetensors import safe_open

        if name not in self._files:
            raise ValueError(f"LoRA payload: {name!r} is not a tensor of the served "
                             f"checkpoint {self.path}")
        with safe_open(self._files[name], framework="pt") as f:
            return f.get_tensor(self._alias.get(name, name))


def merge_payload(tensors: Mapping[str, Any], base: CheckpointBase,
                  shapes: Mapping[str, Any] | None = None,
                  pending: dict[str, Any] | None = None) -> dict[str, Any]:
    """``tensors`` with every adapter pair replaced by its merged weight ``W0 + B @ A``
    (``W0`` from ``base``); full tensors pass through. ``shapes`` (name -> (shape, dtype),
    :func:`rollart_sdk.engine_adapter.checkpoint_shapes`) checks each pair first.

    ``pending``: factors whose partner is in another bucket (a bucket boundary may fall
    between ``A`` and ``B``) wait there for it, across calls; without it they are an
    error. The caller checks that ``pending`` is empty after the last bucket."""
    if pending is None:
        full, pairs = split_adapter(tensors)
    else:
        full = {k: v for k, v in tensors.items() if not is_adapter_name(k)}
        pending.update((k, v) for k, v in tensors.items() if is_adapter_name(k))
        done = {k[: -len(A_SUFFIX)] for k in pending if k.endswith(A_SUFFIX)
                and k[: -len(A_SUFFIX)] + B_SUFFIX in pending}
        ready = {k: pending.pop(k) for w in done for k in adapter_names(w)}
        _, pairs = split_adapter(ready)
    out = dict(full)
    for weight, (a, b) in pairs.items():
        if shapes is not None:
            if weight not in shapes:
                raise ValueError(f"LoRA payload: {weight!r} is not a tensor of the served "
                                 "checkpoint; trainer and engine must serve the same model")
            check_pair(weight, a, b, shapes[weight][0])
        out[weight] = merge(base(weight), a, b)
    return out


def check_no_pending(pending: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the factors that never met their partner."""
    if pending:
        raise ValueError(f"LoRA payload: {sorted(pending)[:4]} arrived without their partner "
                         f"factor (each adapted weight needs both {A_SUFFIX} and {B_SUFFIX} "
                         "in the same version)")


class PayloadMerger:
    """The buckets of one version, adapter pairs merged into full weights against
    ``base`` (:func:`merge_payload`; a pair may straddle buckets), for an engine that loads
    full weights only. :meth:`finish` checks that no factor was left without its partner
    and returns the checkpoint tensors of the adapted weights' modules that the version
    did not carry (the unadapted k_proj beside an adapted q_proj): engines that fuse a
    module's weights (vLLM reloads ``qkv_proj`` as one) need all of them in one update,
    and under LoRA those are the base's."""

    def __init__(self, base: CheckpointBase, shapes: Mapping[str, Any] | None = None) -> None:
        self.base, self.shapes = base, shapes
        self.pending: dict[str, Any] = {}
        self.adapted: set[str] = set()
        self.loaded: set[str] = set()

    def feed(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        out = merge_payload(tensors, self.base, self.shapes, self.pending)
        full = {k for k in tensors if not is_adapter_name(k)}
        self.adapted |= set(out) - full
        self.loaded |= set(out)
        return out

    def finish(self) -> dict[str, Any]:
        check_no_pending(self.pending)
        names = {n for w in self.adapted for n in self.base.siblings(w)} - self.loaded
        return {n: self.base(n) for n in sorted(names)}
