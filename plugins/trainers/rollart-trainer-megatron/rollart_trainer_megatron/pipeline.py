"""Pipeline-parallel layout of trainer ``megatron``: which parameters live on which stage,
their local names, and the CUDA-to-CPU redirection Megatron's schedules need on CPU.

Stage ``s`` of ``pp`` holds decoder layers ``s * L/pp .. (s + 1) * L/pp - 1`` under local
indices ``0 .. L/pp - 1`` (Megatron numbers layers per stage); the first stage also holds
the embedding, the last the final norm and the output layer. With tied embeddings and
``pp > 1`` the last stage holds a copy of the embedding as ``output_layer.weight``
(Megatron's layout); its gradient is summed with the first stage's over Megatron's
embedding group, so both copies take the same AdamW update.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from rollart_trainer_megatron.convert import Arch, megatron_names

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"


@dataclass(frozen=True)
class Stage:
    """This rank's pipeline stage."""

    pp: int
    rank: int
    per_stage: int  # decoder layers per stage

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.pp - 1

    @property
    def offset(self) -> int:
        return self.rank * self.per_stage

    @classmethod
    def of(cls, arch: Arch, pp: int, rank: int) -> Stage:
        if arch.num_layers % pp:
            raise ValueError(
                f"pipeline_parallel_size={pp} must divide the model's {arch.num_layers} "
                "layers (every stage holds the same number of layers)"
            )
        return cls(pp, rank, arch.num_layers // pp)

    def owner(self, global_name: str) -> int:
        """The stage that holds global Megatron parameter ``global_name``."""
        if global_name == EMBEDDING:
            return 0
        m = _LAYER.match(global_name)
        if m:
            return int(m.group(1)) // self.per_stage
        return self.pp - 1  # final norm, output layer

    def local_to_global(self, arch: Arch) -> dict[str, str]:
        """Local parameter name -> global (PP = 1) name, for this stage's parameters."""
        out = {}
        for name in megatron_names(arch):
            if self.owner(name) != self.rank:
                continue
            m = _LAYER.match(name)
            local = (f"decoder.layers.{int(m.group(1)) - self.offset}.{m.group(2)}"
                     if m else name)
            out[local] = name
        if arch.tied and self.pp > 1 and self.last:
            out[OUTPUT] = EMBEDDING  # Megatron's copy of the tied embedding
        return out

    def is_tied_copy(self, local_name: str, arch: Arch) -> bool:
        """True for the last stage's copy of a tied embedding (counted once in norms)."""
        return arch.tied and self.pp > 1 and self.last and local_name == OUTPUT


def localize(state: dict[str, torch.Tensor], arch: Arch, stage: Stage) -> dict[str, torch.Tensor]:
    """This stage's part of a converted (global-name) Megatron state, under local names."""
    return {local: state[g].clone() if local == OUTPUT and g == EMBEDDING else state[g]
            for local, g in stage.local_to_global(arch).items()}


def gather_stages(items: list[tuple[str, torch.Tensor]] | None, src_stage: int,
                  pp_group: Any) -> list[tuple[str, torch.Tensor]]:
    """Broadcast the (name, tensor) list of stage ``src_stage`` to every stage of the
    pipeline group (``items`` is read on that stage only). Collective over PP."""
    if dist.get_world_size(pp_group) == 1:
        return list(items or [])
    src = dist.get_global_rank(pp_group, src_stage)
    mine = items or []
    meta: list[Any] = [[(n, tuple(t.shape), t.dtype) for n, t in mine]]
    dist.broadcast_object_list(meta, src=src, group=pp_group)
    out = []
    for i, (name, shape, dtype) in enumerate(meta[0]):
        t = mine[i][1].contiguous() if mine else torch.empty(shape, dtype=dtype)
        dist.broadcast(t, src=src, group=pp_group)
        out.append((name, t))
    return out


class CudaToCpu(TorchFunctionMode):
    """Redirects ``device='cuda'`` and ``Tensor.cuda()`` to the CPU while active.

    megatron-core 0.16's schedules allocate ``total_num_tokens`` with ``device="cuda"``
    (``schedules.py``), and ``LanguageModule.setup_embeddings_and_output_layer`` moves the
    tied embedding copy to CUDA (``weight.data.cuda()``) before all-reducing it over the
    embedding group; nothing else under the mode names CUDA.
    """

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def device_mode(cpu: bool) -> Any:
    """:class:`CudaToCpu` on CPU, a no-op context on GPU."""
    import contextlib

    return CudaToCpu() if cpu else contextlib.nullcontext()
