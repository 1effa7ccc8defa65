"""The ``sim:`` section of a run config (read by ``rollart sim`` / ``clock: simulated``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.sim.costs import MODELS, HardwareClass, ModelSpec


class SimConfig(BaseModel):
    """What the simulation's cost models need beyond the backends' own options."""

    model_config = ConfigDict(extra="forbid")

    model: str | ModelSpec = Field(
        "qwen3-8b", description="a preset (qwen3-8b, qwen3-14b, qwen3-32b) or a ModelSpec")
    hardware: dict[str, HardwareClass] = Field(
        default_factory=dict, description="hardware classes by the pools' `hardware` name "
                                          "(built in: H800, H100, H20, A100)")
    token_block: int = Field(1, ge=1, description="modelled tokens per token id (memory)")
    progress_every: int = Field(0, ge=0, description="print a line every N steps (0: off)")

    def model_spec(self) -> ModelSpec:
        if isinstance(self.model, ModelSpec):
            return self.model
        if self.model not in MODELS:
            raise ValueError(f"sim.model: unknown preset {self.model!r}; presets: "
                             f"{', '.join(MODELS)} (or give params_b, layers, hidden, "
                             "kv_heads, head_dim)")
        return MODELS[self.model]
