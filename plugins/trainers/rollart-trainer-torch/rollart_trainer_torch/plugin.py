"""Registers trainer ``torch``. Imports nothing heavy: the trainer module (torch,
transformers) is imported only when a config selects ``trainer.name: torch``."""

from __future__ import annotations

from typing import Any

from rollart_sdk import hookimpl


@hookimpl
def rollart_register_trainers(registry: Any) -> None:
    registry.register(
        "torch",
        factory="rollart_trainer_torch.trainer:TorchTrainer",
        options="rollart_trainer_torch.options:TorchTrainerOptions",
        summary="GRPO / PPO-clip with truncated IS on a Hugging Face causal LM "
        "(PyTorch, AdamW, data parallel via torch.distributed)",
    )
