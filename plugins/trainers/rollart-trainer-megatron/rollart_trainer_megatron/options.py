"""Options of trainer ``megatron`` (``trainer.options`` in a run config).

Kept free of torch and megatron-core so that validating a config does not import them.
The loss, optimiser and runtime fields are every trainer's
(:class:`rollart_sdk.backends.trainer_options.TrainerOptionsBase`): they mean exactly
what they mean for trainer ``torch``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from rollart_sdk.backends.trainer_options import TrainerOptionsBase


class MegatronTrainerOptions(TrainerOptionsBase):
    """Parallelism and batching settings (see the package README); AdamW, loss,
    advantages, runtime, the learning-rate schedule and mixed precision as trainer
    torch's (:class:`rollart_sdk.backends.trainer_options.TrainerOptionsBase`)."""

    # Placement (rollart_sdk/resources/demand.py): each rank is one worker holding one
    # device; roles.actor_train.workers must be a multiple of TP x PP (one DP rank).
    device_demand_fields: ClassVar[tuple[str, ...]] = (
        "tensor_parallel_size", "pipeline_parallel_size")

    # Parallelism: world_size = tensor_parallel_size * pipeline_parallel_size * DP size.
    tensor_parallel_size: int = Field(1, ge=1, description=(
        "ranks a layer's weights are split over (world_size = TP x PP x data-parallel)"))
    pipeline_parallel_size: int = Field(1, ge=1, description=(  # 1F1B schedule (schedule.py)
        "pipeline stages (Megatron's 1F1B schedule)"))
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

    @model_validator(mode="after")
    def _rounding_with_the_distributed_optimizer(self) -> MegatronTrainerOptions:
        if self.use_distributed_optimizer and self.master_rounding == "stochastic":
            raise ValueError("master_rounding stochastic is not implemented with "
                             "use_distributed_optimizer (its shards are rounded to "
                             "nearest); set master_rounding to auto or nearest, or turn "
                             "the distributed optimizer off")
        return self

    def workers_multiple(self) -> int:
        """Workers (ranks, one device each) per data-parallel rank: TP x PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size
