"""The options every trainer backend takes (``trainer.options`` in a run config):
AdamW, the decoupled PPO loss, GRPO advantages, the runtime, the learning-rate schedule
(:class:`~rollart_sdk.backends.schedules.LRScheduleOptions`) and mixed precision
(:class:`~rollart_sdk.backends.precision.PrecisionOptions`). A backend's options model extends
:class:`TrainerOptionsBase` with its own batching and parallelism fields, so a field
means the same in every backend and is described once.

Free of torch: options modules import it to validate a config.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rollart_sdk.backends.precision import PrecisionOptions
from rollart_sdk.backends.schedules import LRScheduleOptions


class TrainerOptionsBase(PrecisionOptions, LRScheduleOptions):
    """Optimiser, loss, advantage and runtime settings shared by the trainer backends;
    the fields :func:`rollart_sdk.backends.objective.decoupled_ppo_objective` reads."""

    model_config = ConfigDict(extra="forbid")

    # AdamW
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate (the base of lr_schedule)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1)")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 = no "
                             "clipping (the norm is still reported as train/grad_norm)")
    # Loss
    clip_eps: float = Field(0.2, gt=0, lt=1, description=(
        "PPO clip range, lower side (and upper unless clip_eps_high is set)"))
    clip_eps_high: float | None = Field(None, gt=0, description=(
        "upper PPO clip (DAPO clip-higher); null = clip_eps"))
    tis_cap: float = Field(2.0, gt=0, description=(
        "truncation of the importance weight of stale tokens (truncated IS)"))
    tis_on_fresh: bool = Field(False, description=(
        "also importance-weight fresh tokens (engine/trainer numeric mismatch)"))
    stale_anchor: Literal["proximal", "behaviour"] = Field("behaviour", description=(
        "where a stale token's PPO ratio is anchored: behaviour (pi / mu, clipped to "
        "1 +- clip_eps: a token already moved past the clip range since it was sampled "
        "gets no further push) or proximal (AReaL's decoupled PPO: the weights before "
        "this update, weighted by min(pi_prox / mu, tis_cap); with one update per batch "
        "its clip never binds)"))
    loss_agg: Literal["token-mean", "seq-mean"] = Field("token-mean", description=(
        "how token losses are averaged: over all tokens of the batch, or per sequence "
        "then over sequences"))
    kl_coef: float = Field(0.0, ge=0, description=(
        "weight of the KL penalty to the initial model; 0 = no reference model is loaded"))
    kl_kind: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k2/k3)")
    # Advantages (when samples arrive without one), over the whole batch.
    adv_estimator: Literal["grpo", "rloo", "reinforce_pp_baseline"] = Field(
        "grpo", description=(
            "grpo: the reward minus its group's mean, over the group's std (adv_normalize_std); "
            "rloo: minus the mean of the group's other members (RLOO); reinforce_pp_baseline: "
            "minus the group mean, then whitened over the batch's trained tokens "
            "(REINFORCE++-baseline, as verl computes it). rollart_sdk/algorithms/advantages.py"))
    adv_eps: float = Field(1e-6, ge=0, description="epsilon in the GRPO std normalisation")
    adv_normalize_std: bool = Field(True, description=(
        "grpo only: divide advantages by the group std (GRPO); false = centre only (Dr. "
        "GRPO)"))
    # Runtime
    seed: int = Field(0, description="torch / python RNG seed of the trainer")
    device: str = Field("auto", description="auto (CUDA if present), cpu, cuda or cuda:N")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description=(
        "torch.distributed backend of the trainer's ranks; auto: gloo on CPU, nccl on CUDA"))
    num_threads: int | None = Field(None, ge=1, description=(
        "torch intra-op threads on the CPU (set 1 when ranks share a small CPU); null = "
        "torch's default"))
    compute_entropy: bool = Field(True, description=(
        "report train/entropy, the mean next-token entropy (one softmax per token)"))

    @model_validator(mode="after")
    def _betas(self) -> TrainerOptionsBase:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {list(self.betas)}")
        return self

    @model_validator(mode="after")
    def _std_for_grpo(self) -> TrainerOptionsBase:
        if not self.adv_normalize_std and self.adv_estimator != "grpo":
            raise ValueError(
                f"adv_normalize_std: false is GRPO's switch (Dr. GRPO); adv_estimator "
                f"{self.adv_estimator!r} never divides by the group std: leave "
                "adv_normalize_std unset, or use adv_estimator: grpo")
        return self
