"""Options of trainer ``megatron`` (``trainer.options`` in a run config).

Kept free of torch and megatron-core so that validating a config does not import them.
The loss and optimiser fields mean exactly what they mean for trainer ``torch``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from rollart_sdk.precision import PrecisionOptions
from rollart_sdk.schedules import LRScheduleOptions


class MegatronTrainerOptions(PrecisionOptions, LRScheduleOptions):
    """Parallelism, batching, optimiser and loss settings (see the package README); the
    learning-rate schedule as trainer torch's (:class:`rollart_sdk.schedules.LRScheduleOptions`);
    fp32 master weights and float16 loss scaling as trainer torch's
    (:class:`rollart_sdk.precision.PrecisionOptions`)."""

    model_config = ConfigDict(extra="forbid")
    # Placement (rollart_sdk/resources/demand.py): each rank is one worker holding one
    # device; roles.actor_train.workers must be a multiple of TP x PP (one DP rank).
    device_demand_fields: ClassVar[tuple[str, ...]] = (
        "tensor_parallel_size", "pipeline_parallel_size")

    # Parallelism: world_size = tensor_parallel_size * pipeline_parallel_size * DP size.
    tensor_parallel_size: int = Field(1, ge=1, description=(
        "ranks a layer's weights are split over (world_size = TP x PP x data-parallel)"))
    pipeline_parallel_size: int = Field(1, ge=1, description=(  # 1F1B schedule (schedule.py)
        "pipeline stages (Megatron's 1F1B schedule)"))
    # AdamW
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate (the base of lr_schedule)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1)")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 = no clipping")
    # Megatron's distributed optimizer (ZeRO-1): AdamW state sharded over the DP group,
    # gradients reduce-scattered, parameters all-gathered (distopt.py).
    use_distributed_optimizer: bool = Field(False, description=(
        "ZeRO-1: AdamW state sharded over the data-parallel group, gradients "
        "reduce-scattered, parameters all-gathered"))
    # Batching: trajectories are packed into rows of at most pack_length tokens (None: the
    # longest trajectory of the batch; attention is dense within a row, O(row^2), so
    # longer rows cost more on CPU); rows are stacked into micro-batches of at most
    # max_tokens_per_micro_batch tokens (rows x longest row) and micro_batch_size
    # trajectories (None: no count bound). One forward/backward per micro-batch.
    pack_length: int | None = Field(None, ge=2, description=(
        "trajectories are packed into rows of at most this many tokens; null = the "
        "longest trajectory of the batch"))
    max_tokens_per_micro_batch: int = Field(8192, ge=2, description=(
        "at most this many tokens (rows x longest row) per forward/backward"))
    micro_batch_size: int | None = Field(None, ge=1, description=(
        "at most this many trajectories per micro-batch; null = bounded by tokens only"))
    # Loss (same meaning as trainer torch)
    clip_eps: float = Field(0.2, gt=0, lt=1, description=(
        "PPO clip range, lower side (and upper unless clip_eps_high is set)"))
    clip_eps_high: float | None = Field(None, gt=0, description=(
        "upper PPO clip (DAPO clip-higher); null = clip_eps"))
    tis_cap: float = Field(2.0, gt=0, description=(
        "truncation of the importance weight of stale tokens (truncated IS)"))
    tis_on_fresh: bool = Field(False, description=(
        "also importance-weight fresh tokens (engine/trainer numeric mismatch)"))
    loss_agg: Literal["token-mean", "seq-mean"] = Field("token-mean", description=(
        "how token losses are averaged: over all tokens of the batch, or per sequence "
        "then over sequences"))
    kl_coef: float = Field(0.0, ge=0, description=(
        "weight of the KL penalty to the initial model; 0 = no reference model is loaded"))
    kl_kind: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k2/k3)")
    adv_eps: float = Field(1e-6, ge=0, description="epsilon in the GRPO std normalisation")
    adv_normalize_std: bool = Field(True, description=(
        "divide advantages by the group std (GRPO); false = centre only (Dr. GRPO)"))
    # Runtime
    seed: int = Field(0, description="torch / python RNG seed of the trainer")
    device: str = Field("auto", description="auto (CUDA if present), cpu or cuda")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description=(
        "torch.distributed backend; auto: gloo on CPU, nccl on CUDA"))
    num_threads: int | None = Field(None, ge=1, description=(
        "torch intra-op threads on the CPU; null = torch's default"))
    compute_entropy: bool = Field(True, description=(
        "report train/entropy, the mean next-token entropy (one softmax per token)"))

    def workers_multiple(self) -> int:
        """Workers (ranks, one device each) per data-parallel rank: TP x PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @model_validator(mode="after")
    def _check(self) -> MegatronTrainerOptions:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {list(self.betas)}")
        return self
