"""Registers trainer ``megatron``. Imports nothing heavy: megatron-core and torch are
imported only when a config selects ``trainer.name: megatron``."""

from __future__ import annotations

from typing import Any

from rollart_sdk import hookimpl


@hookimpl
def rollart_register_trainers(registry: Any) -> None:
    registry.register(
        "megatron",
        factory="rollart_trainer_megatron.trainer:MegatronTrainer",
        options="rollart_trainer_megatron.options:MegatronTrainerOptions",
        summary="GRPO / PPO-clip with truncated IS on megatron-core's GPTModel "
        "(tensor + data parallel, packed micro-batches, distributed checkpoints)",
        requires={"megatron.core": "pip install -c constraints.txt 'megatron-core==0.16.1' "
                                   "(plugins/trainers/rollart-trainer-megatron/README.md)"},
    )


@hookimpl
def rollart_register_benchmarks(registry: Any) -> None:
    registry.register(
        "trainers",
        factory="rollart_trainer_megatron.bench:main",
        summary="trainer megatron (TP 1, TP 2) vs torch: step time on one batch",
    )
