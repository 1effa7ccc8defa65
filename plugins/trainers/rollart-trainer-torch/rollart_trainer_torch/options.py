"""Options of trainer ``torch`` (``trainer.options`` in a run config).

Kept free of torch so that validating a config does not import it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollart_sdk.precision import PrecisionOptions
from rollart_sdk.schedules import LRScheduleOptions

# Every linear projection of a Llama-family decoder layer (not the LM head/embeddings).
LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj")


class LoraOptions(BaseModel):
    """``trainer.options.lora``: low-rank adapters (peft's LoRA) on the model's linear
    layers; only the adapters train, and only they travel to the engines
    (:mod:`rollart_trainer_torch.lora`)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, ge=1, le=1024, description="LoRA rank r (the adapters' inner size)")
    alpha: float = Field(16.0, gt=0, description=(
        "LoRA alpha: the update is (alpha / rank) * B @ A"))
    dropout: float = Field(0.0, ge=0, lt=1, description=(
        "dropout on the adapters' input during training (0: the trainer's log-probs are "
        "the engine's policy exactly)"))
    target_modules: list[str] = Field(list(LORA_DEFAULT_TARGETS), min_length=1, description=(
        "names (last component) of the linear layers that get adapters; default: every "
        "attention and MLP projection of a Llama-family model"))
    save_merged: bool = Field(False, description=(
        "final_model/ (save_pretrained) also holds merged/: the base weights with the "
        "adapter merged in, a plain Hugging Face checkpoint"))

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not n or not isinstance(n, str)]
        if bad:
            raise ValueError(f"target_modules must be non-empty layer names, got {v}")
        return v


class TorchTrainerOptions(PrecisionOptions, LRScheduleOptions):
    """Optimiser, loss and parallelism settings; see the package README for formulas.
    The learning-rate schedule (``lr_schedule``, ``lr_warmup_steps``, ``lr_decay_steps``,
    ``lr_min_ratio``): :class:`rollart_sdk.schedules.LRScheduleOptions`; fp32 master
    weights and loss scaling for a bfloat16 / float16 model (``master_weights``,
    ``loss_scale``, ``loss_scale_init``, ``loss_scale_growth_interval``):
    :class:`rollart_sdk.precision.PrecisionOptions`."""

    model_config = ConfigDict(extra="forbid")

    # AdamW
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate (the base of lr_schedule)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1)")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 = no "
                             "clipping (the norm is still reported as train/grad_norm)")
    # AdamW steps per batch (TRL's num_iterations, verl's ppo_epochs, GRPO's mu): the
    # later passes reuse the first pass's anchors, so PPO's clip bounds how far they move.
    # The policy version still advances by one per batch.
    updates_per_batch: int = Field(1, ge=1, le=16, description=(
        "AdamW steps per batch (TRL's num_iterations, verl's ppo_epochs, GRPO's mu); later "
        "passes keep the first pass's anchors, the version advances by one per batch"))
    # Batching: sequences per forward/backward; gradients accumulate over micro-batches.
    micro_batch_size: int = Field(4, ge=1, description=(
        "sequences per forward/backward; gradients accumulate over micro-batches"))
    # ... and at most this many padded tokens (sequences x the longest) per forward.
    micro_batch_tokens: int = Field(8192, ge=1, description=(
        "at most this many tokens per forward (padded, or the distinct tokens of a "
        "shared-prefix tree)"))
    # Shared prefixes (a group's prompt, a multi-turn episode's common turns) computed
    # once per micro-batch (Llama-family models): "auto" when the distinct prefix tokens
    # are at most prefix_sharing_max_ratio of the batch's tokens.
    prefix_sharing: Literal["auto", "on", "off"] = Field("auto", description=(
        "compute each shared prefix (a group's prompt, an episode's common turns) once per "
        "micro-batch (Llama-family models); auto: when it saves enough "
        "(prefix_sharing_max_ratio)"))
    prefix_sharing_max_ratio: float = Field(0.8, gt=0, le=1, description=(
        "auto uses prefix sharing when the distinct tokens are at most this fraction of "
        "the batch's tokens"))
    # Loss
    clip_eps: float = Field(0.2, gt=0, lt=1, description=(
        "PPO clip range, lower side (and upper unless clip_eps_high is set)"))
    clip_eps_high: float | None = Field(None, gt=0, description=(
        "upper PPO clip (DAPO clip-higher); null = clip_eps"))
    tis_cap: float = Field(2.0, gt=0, description=(
        "truncation of the importance weight of stale tokens (truncated IS)"))
    # Samples with advantage 0 add nothing to the loss (without a KL term): not run.
    skip_zero_advantage: bool = Field(True, description=(
        "do not run samples whose advantage is 0 through the model when kl_coef is 0 "
        "(same update, less compute)"))
    tis_on_fresh: bool = Field(False, description=(
        "also importance-weight fresh tokens (engine/trainer numeric mismatch)"))
    loss_agg: Literal["token-mean", "seq-mean"] = Field("token-mean", description=(
        "how token losses are averaged: over all tokens of the batch, or per sequence "
        "then over sequences"))
    kl_coef: float = Field(0.0, ge=0, description=(
        "weight of the KL penalty to the initial model; 0 = no reference model is loaded"))
    kl_kind: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k2/k3)")
    # Advantages (when samples arrive without one): GRPO over the whole batch.
    adv_eps: float = Field(1e-6, ge=0, description="epsilon in the GRPO std normalisation")
    adv_normalize_std: bool = Field(True, description=(
        "divide advantages by the group std (GRPO); false = centre only (Dr. GRPO)"))
    # Runtime
    seed: int = Field(0, description="torch / python RNG seed of the trainer")
    device: str = Field("auto", description="auto (CUDA if present), cpu, cuda or cuda:N")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description=(
        "torch.distributed backend of data-parallel ranks; auto: gloo on CPU, nccl on CUDA"))
    num_threads: int | None = Field(None, ge=1, description=(
        "torch intra-op threads on the CPU (set 1 when ranks share a small CPU); null = "
        "torch's default"))
    gradient_checkpointing: bool = Field(False, description=(
        "recompute activations in backward: less memory, more compute (transformers' model)"))
    compute_entropy: bool = Field(True, description=(
        "report train/entropy, the mean next-token entropy (one softmax per token)"))
    grad_bucket_mb: float = Field(64.0, gt=0, description=(
        "all-reduce gradients in buckets of this many MiB (data parallel)"))
    lora: LoraOptions | None = Field(None, description=(
        "train LoRA adapters instead of the full model (null: full fine-tuning); engines "
        "receive only the adapters (docs/trainers.md, LoRA)"))

    @model_validator(mode="after")
    def _betas(self) -> TorchTrainerOptions:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {list(self.betas)}")
        return self
