"""Options of engine ``sglang`` (validated from ``engine.options``; imports no SGLang)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollart_sdk.backends.model_shape import context_problems, tensor_parallel_problems


class SglangEngineOptions(BaseModel):
    """How SGLang serves the policy (names follow SGLang's ``ServerArgs`` where they map)."""

    model_config = ConfigDict(extra="forbid")
    # Placement (rollart_sdk/resources/demand.py): one engine holds tp_size devices,
    # reserved as one bundle.
    device_demand_fields: ClassVar[tuple[str, ...]] = ("tp_size",)

    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="cpu: SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1, torch_native attention)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="serving dtype; auto: model.dtype"
    )
    context_length: int | None = Field(
        None, ge=2, description="prompt + generated tokens per request; None: the model's"
    )
    max_running_requests: int = Field(64, ge=1, description="requests decoded together")
    enable_prefix_caching: bool = Field(
        True, description="SGLang's radix cache (disable_radix_cache = not this)"
    )
    mem_fraction_static: float | None = Field(
        None, gt=0.0, lt=1.0, description="share of device memory for weights + KV cache"
    )
    max_total_tokens: int | None = Field(
        None, ge=1, description="KV-cache size in tokens (all requests together); None: from "
        "mem_fraction_static. On device 'cpu' SGLang otherwise sizes it from free host memory"
    )
    tp_size: int = Field(1, ge=1, description="tensor-parallel ranks per engine")
    attention_backend: str | None = Field(
        None, description="SGLang attention backend; None: SGLang's choice (cpu: torch_native)"
    )
    seed: int = Field(0, description="SGLang random_seed; requests that bring a seed use their own")
    eos_token_ids: list[int] | None = Field(
        None, description="ids ending a generation besides stop_token_ids; None: the model's"
    )
    deterministic_inference: bool = Field(
        False, description="SGLang enable_deterministic_inference (batch-invariant kernels): "
        "without it SGLang 0.5.23 ignores per-request seeds; needs a GPU attention backend"
    )

    def device_demand(self) -> int:
        """Devices one engine worker needs: its tensor-parallel ranks."""
        return self.tp_size

    def model_problems(self, config: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A ``tp_size`` SGLang cannot split the model's heads by
        (``rollart_sdk/backends/model_shape.py``), a ``context_length`` beyond the model's."""
        out = tensor_parallel_problems(config, self.tp_size, "tp_size", replicate_kv=True)
        out += context_problems(config, self.context_length, "context_length")
        return out

    @model_validator(mode="after")
    def _possible(self) -> SglangEngineOptions:
        problems = []
        if self.device == "cpu" and self.dtype == "float16":
            problems.append("SGLang's CPU engine does not compute in float16; use bfloat16 or float32")
        if self.device == "cpu" and self.tp_size > 1:
            problems.append("tp_size > 1 needs GPUs; SGLang's CPU engine here runs one rank")
        if self.device == "cpu" and self.attention_backend not in (None, "torch_native"):
            problems.append(
                f"attention_backend {self.attention_backend!r} needs a GPU; on device 'cpu' "
                "use torch_native (or leave it unset)"
            )
        if self.device == "cpu" and self.deterministic_inference:
            problems.append(
                "deterministic_inference needs a GPU attention backend (SGLang 0.5.23 rejects "
                "torch_native with it); on device 'cpu' seeded requests are not reproducible"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
