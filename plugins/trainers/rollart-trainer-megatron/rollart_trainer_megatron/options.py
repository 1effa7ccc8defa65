"""Options of trainer ``megatron`` (``trainer.options`` in a run config).

Kept free of torch and megatron-core so that validating a config does not import them.
The loss, optimiser and runtime fields are every trainer's
(:class:`rollart_sdk.backends.trainer_options.TrainerOptionsBase`): they mean exactly
what they mean for trainer ``torch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator

from rollart_sdk.backends.model_shape import architecture_problems, tensor_parallel_problems
from rollart_sdk.backends.trainer_options import TrainerOptionsBase

# The models and rope scalings Megatron's GPTModel reproduces (runtime.py::build_gpt).
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_SCALINGS = ("default", "llama3")


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

    def model_problems(self, config: Mapping[str, Any]) -> list[tuple[str | None, str]]:
        """What the model (its HF config) cannot be trained with here
        (``rollart_sdk/backends/model_shape.py``): a tensor-parallel size that does not
        split its heads, query groups and MLP evenly, a pipeline size that does not divide
        its layers, an activation or rope scaling Megatron's GPTModel does not reproduce.
        ``convert.Arch.from_hf`` and ``pipeline.Stage.of`` raise on the same rules."""
        out: list[tuple[str | None, str]] = list(tensor_parallel_problems(
            config, self.tensor_parallel_size, "tensor_parallel_size", replicate_kv=False))
        layers = config.get("num_hidden_layers")
        pp = self.pipeline_parallel_size
        if isinstance(layers, int) and layers % pp:
            fits = [d for d in range(1, layers + 1) if layers % d == 0]
            out.append(("pipeline_parallel_size", f"pipeline_parallel_size={pp} must divide "
                        f"the model's {layers} layers (every stage holds the same number of "
                        f"layers); choose one of {', '.join(map(str, fits))}"))
        # What Megatron's GPTModel with the local layer spec computes: a Llama-family
        # decoder (runtime.py::build_gpt), q/k/v biases but no other linear bias.
        unsupported = architecture_problems(config, MODEL_TYPES, ROPE_SCALINGS)
        if config.get("mlp_bias"):
            unsupported.append("mlp_bias (MLP biases)")
        if config.get("attention_bias") and config.get("model_type") in ("llama", "mistral"):
            unsupported.append("attention_bias (an o_proj bias besides the q/k/v ones)")
        out += [(None, f"the model's {what} is not supported by trainer megatron (its "
                 "GPTModel would compute another model); use trainer torch")
                for what in unsupported]
        return out
