"""Options of trainer ``megatron`` (``trainer.options`` in a run config).

Kept free of torch and megatron-core so that validating a config does not import them.
The loss and optimiser fields mean exactly what they mean for trainer ``torch``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rollart_sdk.precision import PrecisionOptions
from rollart_sdk.schedules import LRScheduleOptions


class MegatronTrainerOptions(PrecisionOptions, LRScheduleOptions):
    """Parallelism, batching, optimiser and loss settings (see the package README); the
    learning-rate schedule as trainer torch's (:class:`rollart_sdk.schedules.LRScheduleOptions`);
    fp32 master weights and float16 loss scaling as trainer torch's
    (:class:`rollart_sdk.precision.PrecisionOptions`)."""

    model_config = ConfigDict(extra="forbid")

    # Parallelism: world_size = tensor_parallel_size * pipeline_parallel_size * DP size.
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)  # Megatron's 1F1B schedule (schedule.py)
    # AdamW
    lr: float = Field(1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0)  # max global grad norm; 0 = no clipping
    # Megatron's distributed optimizer (ZeRO-1): AdamW state sharded over the DP group,
    # gradients reduce-scattered, parameters all-gathered (distopt.py).
    use_distributed_optimizer: bool = False
    # Batching: trajectories are packed into rows of at most pack_length tokens (None: the
    # longest trajectory of the batch; attention is dense within a row, O(row^2), so
    # longer rows cost more on CPU); rows are stacked into micro-batches of at most
    # max_tokens_per_micro_batch tokens (rows x longest row) and micro_batch_size
    # trajectories (None: no count bound). One forward/backward per micro-batch.
    pack_length: int | None = Field(None, ge=2)
    max_tokens_per_micro_batch: int = Field(8192, ge=2)
    micro_batch_size: int | None = Field(None, ge=1)
    # Loss (same meaning as trainer torch)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    clip_eps_high: float | None = Field(None, gt=0)
    tis_cap: float = Field(2.0, gt=0)
    tis_on_fresh: bool = False
    loss_agg: Literal["token-mean", "seq-mean"] = "token-mean"
    kl_coef: float = Field(0.0, ge=0)
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    adv_eps: float = Field(1e-6, ge=0)
    adv_normalize_std: bool = True
    # Runtime
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    num_threads: int | None = Field(None, ge=1)
    compute_entropy: bool = True

    @model_validator(mode="after")
    def _check(self) -> MegatronTrainerOptions:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {list(self.betas)}")
        return self
