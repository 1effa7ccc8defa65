"""Options of trainer ``torch`` (``trainer.options`` in a run config).

Kept free of torch so that validating a config does not import it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart_sdk.backends.trainer_options import TrainerOptionsBase


class TorchTrainerOptions(TrainerOptionsBase):
    """Batching and data-parallel settings; see the package README for formulas. AdamW,
    loss, advantages, runtime, the learning-rate schedule and mixed precision are every
    trainer's: :class:`rollart_sdk.backends.trainer_options.TrainerOptionsBase`."""

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
    # Samples with advantage 0 add nothing to the loss (without a KL term): not run.
    skip_zero_advantage: bool = Field(True, description=(
        "do not run samples whose advantage is 0 through the model when kl_coef is 0 "
        "(same update, less compute)"))
    gradient_checkpointing: bool = Field(False, description=(
        "recompute activations in backward: less memory, more compute (transformers' model)"))
    grad_bucket_mb: float = Field(64.0, gt=0, description=(
        "all-reduce gradients in buckets of this many MiB (data parallel)"))
