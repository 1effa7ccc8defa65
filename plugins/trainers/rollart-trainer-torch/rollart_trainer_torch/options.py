"""Options of trainer ``torch`` (``trainer.options`` in a run config).

Kept free of torch so that validating a config does not import it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rollart_sdk.precision import PrecisionOptions
from rollart_sdk.schedules import LRScheduleOptions


class TorchTrainerOptions(PrecisionOptions, LRScheduleOptions):
    """Optimiser, loss and parallelism settings; see the package README for formulas.
    The learning-rate schedule (``lr_schedule``, ``lr_warmup_steps``, ``lr_decay_steps``,
    ``lr_min_ratio``): :class:`rollart_sdk.schedules.LRScheduleOptions`; fp32 master
    weights and loss scaling for a bfloat16 / float16 model (``master_weights``,
    ``loss_scale``, ``loss_scale_init``, ``loss_scale_growth_interval``):
    :class:`rollart_sdk.precision.PrecisionOptions`."""

    model_config = ConfigDict(extra="forbid")

    # AdamW
    lr: float = Field(1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0)  # max global grad norm; 0 = no clipping
    # AdamW steps per batch (TRL's num_iterations, verl's ppo_epochs, GRPO's mu): the
    # later passes reuse the first pass's anchors, so PPO's clip bounds how far they move.
    # The policy version still advances by one per batch.
    updates_per_batch: int = Field(1, ge=1, le=16)
    # Batching: sequences per forward/backward; gradients accumulate over micro-batches.
    micro_batch_size: int = Field(4, ge=1)
    # ... and at most this many padded tokens (sequences x the longest) per forward.
    micro_batch_tokens: int = Field(8192, ge=1)
    # Shared prefixes (a group's prompt, a multi-turn episode's common turns) computed
    # once per micro-batch (Llama-family models): "auto" when the distinct prefix tokens
    # are at most prefix_sharing_max_ratio of the batch's tokens.
    prefix_sharing: Literal["auto", "on", "off"] = "auto"
    prefix_sharing_max_ratio: float = Field(0.8, gt=0, le=1)
    # Loss
    clip_eps: float = Field(0.2, gt=0, lt=1)  # PPO clip, lower side (and upper by default)
    clip_eps_high: float | None = Field(None, gt=0)  # DAPO clip-higher; None = clip_eps
    tis_cap: float = Field(2.0, gt=0)  # truncation of importance weights of stale tokens
    # Samples with advantage 0 add nothing to the loss (without a KL term): not run.
    skip_zero_advantage: bool = True
    tis_on_fresh: bool = False  # also correct engine/trainer numeric mismatch on fresh tokens
    loss_agg: Literal["token-mean", "seq-mean"] = "token-mean"
    kl_coef: float = Field(0.0, ge=0)  # 0 = no reference model is loaded
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    # Advantages (when samples arrive without one): GRPO over the whole batch.
    adv_eps: float = Field(1e-6, ge=0)
    adv_normalize_std: bool = True
    # Runtime
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    num_threads: int | None = Field(None, ge=1)  # torch intra-op threads (CPU)
    gradient_checkpointing: bool = False
    compute_entropy: bool = True  # entropy metric: one softmax over the vocabulary per token
    grad_bucket_mb: float = Field(64.0, gt=0)  # all-reduce gradients in buckets of this size

    @model_validator(mode="after")
    def _betas(self) -> TorchTrainerOptions:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {list(self.betas)}")
        return self
