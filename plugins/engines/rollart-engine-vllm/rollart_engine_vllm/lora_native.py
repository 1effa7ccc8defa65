"""vLLM's own LoRA serving for adapter payloads (engine option ``lora: native``).

A LoRA weight update (:mod:`rollart_sdk.weights.lora`: ``<W>.lora_A`` ``[r, in]`` and
``<W>.lora_B`` ``[out, r]``, the scale ``alpha / r`` already in ``B``) is written as a peft
adapter folder (``adapter_config.json`` with ``lora_alpha = r``, so vLLM's scale is 1, and
``adapter_model.safetensors``) and served by vLLM as a ``LoRARequest`` per version: the
base weights are never touched, only the adapter's bytes are written, and vLLM adds
``B @ A x`` in every forward (its punica kernels; on CPU their torch ops). The default,
``lora: merge``, merges ``W0 + B @ A`` into the served weights instead
(:func:`rollart_sdk.backends.engine_adapter.convert_buckets`).

Full tensors in the same version are loaded into the base weights as ever (they replace
``W0``; the adapter applies on top).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart_sdk.types import WeightBucket
from rollart_sdk.weights.lora import check_pair, is_adapter_name, split_adapter

PREFIX = "base_model.model."  # peft's prefix of the wrapped model's tensor names


@dataclass
class NativeUpdate:
    """One version's update in ``lora: native``: the adapter folder (None: the version
    carried no adapter) and the full-tensor buckets, converted for the base weights."""

    adapter: str | None = None
    rank: int = 0
    full: list[Any] = field(default_factory=list)


def split_buckets(buckets: Iterable[WeightBucket]) -> tuple[dict[str, Any], list[WeightBucket]]:
    """(every adapter factor of the version, the buckets' full tensors as buckets)."""
    factors: dict[str, Any] = {}
    full: list[WeightBucket] = []
    for b in buckets:
        rest = {}
        for name, t in b.tensors.items():
            if is_adapter_name(name):
                factors[name] = t
            else:
                rest[name] = t
        if rest:
            full.append(WeightBucket(b.version, b.index, rest))
    return factors, full


def write_adapter(factors: Mapping[str, Any], shapes: Mapping[str, tuple[list[int], str]],
                  folder: Path, max_rank: int) -> int:
    """Write ``factors`` as a peft LoRA folder under ``folder``; return the rank.

    Raises ``ValueError`` naming the weight when a pair is incomplete, does not multiply,
    does not match the served weight, or the rank is above ``max_rank`` (vLLM reserves
    its LoRA buffers for ``max_lora_rank`` at start)."""
    from safetensors.torch import save_file

    _, pairs = split_adapter(factors)
    ranks = set()
    tensors: dict[str, Any] = {}
    modules = set()
    for weight, (a, b) in pairs.items():
        if weight not in shapes:
            raise ValueError(f"LoRA payload: {weight!r} is not a tensor of the served "
                             "checkpoint; trainer and engine must serve the same model")
        check_pair(weight, a, b, shapes[weight][0])
        if not weight.endswith(".weight"):
            raise ValueError(f"LoRA payload: {weight!r} is not a linear layer's weight")
        module = weight[: -len(".weight")]
        modules.add(module.rsplit(".", 1)[-1])
        ranks.add(int(a.shape[0]))
        tensors[f"{PREFIX}{module}.lora_A.weight"] = a.detach().float().contiguous()
        tensors[f"{PREFIX}{module}.lora_B.weight"] = b.detach().float().contiguous()
    if len(ranks) != 1:
        raise ValueError(f"LoRA payload: adapters of ranks {sorted(ranks)} in one version; "
                         "engine option lora: native serves one rank per adapter (use lora: "
                         "merge)")
    rank = ranks.pop()
    if rank > max_rank:
        raise ValueError(f"LoRA payload: rank {rank} is above engine option max_lora_rank "
                         f"{max_rank}; set engine.options.max_lora_rank >= {rank}")
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
        "lora_alpha": rank,  # B carries alpha / r already: vLLM's scale alpha / r is 1
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": sorted(modules), "modules_to_save": None, "use_rslora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return rank


class AdapterSlots:
    """The adapter folders of the versions vLLM serves (one at a time: an update aborts
    and resubmits in-flight requests, as with merged weights) under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: Any = None  # vllm.lora.request.LoRARequest or None
        self._next_id = 1

    def folder(self, version: int) -> Path:
        return self.root / f"v{version}-{self._next_id}"

    def request(self, folder: str, version: int) -> Any:
        from vllm.lora.request import LoRARequest

        req = LoRARequest(f"rollart-v{version}", self._next_id, folder)
        self._next_id += 1
        return req

    def retire(self, old: Any) -> None:
        if old is not None:
            shutil.rmtree(old.lora_path, ignore_errors=True)
