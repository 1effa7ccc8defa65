"""The ``sim:`` section of a run config (read by ``rollart sim`` and ``clock: simulated``):
plain data the schema validates, with the built-in presets. The cost models that use them
are the simulator's (:mod:`rollart_sdk.sim.costs`, which re-exports these names); they live
here so that the config schema does not import the simulator."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HardwareClass(_Strict):
    """One accelerator: peak dense FLOP/s (TFLOP/s), HBM bandwidth (TB/s), memory (GB)."""

    tflops: float = Field(gt=0, description="peak dense bf16 TFLOP/s of one device")
    hbm_tbps: float = Field(gt=0, description="memory bandwidth of one device, TB/s")
    memory_gb: float = Field(80.0, gt=0)
    mfu: float = Field(0.5, gt=0, le=1, description="fraction of peak FLOP/s reached")
    mbu: float = Field(0.75, gt=0, le=1, description="fraction of peak bandwidth reached")
    step_overhead_s: float = Field(0.003, ge=0, description="fixed cost of one engine step")
    seq_overhead_s: float = Field(0.0, ge=0, description="cost per sequence in a step (host-side "
                                                       "scheduling/sampling; fitted on CPUs)")
    kv_memory_fraction: float = Field(0.9, gt=0, le=1,
                                      description="memory share for weights + KV cache")

    @property
    def flops(self) -> float:
        return self.tflops * 1e12 * self.mfu

    @property
    def bandwidth(self) -> float:
        return self.hbm_tbps * 1e12 * self.mbu


# The paper's two classes (section 7: H800 compute-optimised, H20 bandwidth-optimised).
HARDWARE: dict[str, HardwareClass] = {
    "H800": HardwareClass(tflops=989, hbm_tbps=3.35, memory_gb=80),
    "H100": HardwareClass(tflops=989, hbm_tbps=3.35, memory_gb=80),
    "H20": HardwareClass(tflops=148, hbm_tbps=4.0, memory_gb=96),
    "A100": HardwareClass(tflops=312, hbm_tbps=2.0, memory_gb=80),
}


class ModelSpec(_Strict):
    """The model's size as the cost model needs it."""

    params_b: float = Field(gt=0, description="parameters, billions")
    active_params_b: float | None = Field(None, gt=0, description="mixture of experts: "
                                          "parameters a token runs through, billions "
                                          "(FLOPs); the weights read are all params_b")
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0, description="attention width (query heads x head dim)")
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    bytes_per_param: float = Field(2.0, gt=0)

    @property
    def params(self) -> float:
        return self.params_b * 1e9

    @property
    def active_params(self) -> float:
        """Parameters per token's FLOPs (all of them for a dense model)."""
        return (self.active_params_b or self.params_b) * 1e9

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        # K and V, every layer, in the weights' precision.
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param


MODELS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec(params_b=8.2, layers=36, hidden=4096, kv_heads=8, head_dim=128),
    "qwen3-14b": ModelSpec(params_b=14.8, layers=40, hidden=5120, kv_heads=8, head_dim=128),
    "qwen3-32b": ModelSpec(params_b=32.8, layers=64, hidden=8192, kv_heads=8, head_dim=128),
    # Mixture of experts: 30.5B parameters, 3.3B active per token.
    "qwen3-30b-a3b": ModelSpec(params_b=30.5, active_params_b=3.3, layers=48, hidden=4096,
                               kv_heads=4, head_dim=128),
}


class SimConfig(_Strict):
    """What the simulation's cost models need beyond the backends' own options."""

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
