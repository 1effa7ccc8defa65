"""Options of trainer ``torch`` (``trainer.options`` in a run config).

Kept free of torch so that validating a config does not import it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollart_sdk.backends.trainer_options import TrainerOptionsBase

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
    lora: LoraOptions | None = Field(None, description=(
        "train LoRA adapters instead of the full model (null: full fine-tuning); engines "
        "receive only the adapters (docs/trainers.md, LoRA)"))

    def requires(self) -> dict[str, str]:
        """Modules these options need, with how to install each (checked by `validate`
        and `train` before anything starts: rollart_sdk.registry.Descriptor.missing)."""
        if self.lora is None:
            return {}
        return {"peft": "trainer.options.lora needs peft: pip install -c constraints.txt "
                        "'rollart-trainer-torch[lora]' (or pip install peft)"}

    @model_validator(mode="after")
    def _sharing_without_checkpointing(self) -> TorchTrainerOptions:
        # The prefix tree runs the shared prefix with the KV cache, which transformers
        # turns off under gradient checkpointing: "auto" then takes the padded forward.
        if self.prefix_sharing == "on" and self.gradient_checkpointing:
            raise ValueError(
                "prefix_sharing: on cannot run with gradient_checkpointing: true (the shared "
                "prefix is computed once through the KV cache, which transformers disables "
                "under checkpointing); set prefix_sharing: auto or off, or "
                "gradient_checkpointing: false")
        return self
