"""Mixed-precision settings of a trainer: fp32 master weights and loss scaling for a model
that runs in ``bfloat16`` or ``float16`` (``model.dtype``), and the warning ``rollart
validate`` gives for a low-precision run without master weights.

Why master weights: bfloat16 keeps 8 significant bits, so a weight ``w`` only moves when
the update is larger than about ``|w| * 2**-9`` (float16: ``2**-12``). AdamW's update is
about ``lr`` per element; at RL learning rates (1e-6 .. 1e-5) and typical weights
(0.01 .. 0.1) most updates of a bf16 parameter round back to the old value, and nothing
says so: the loss moves a little, the policy does not learn. Keeping an fp32 copy of every
weight (and AdamW's moments in fp32), stepping that copy and rounding it into the model
after each step keeps every small update (Megatron's ``Float16OptimizerWithFloat16Params``,
DeepSpeed's and Apex's fp16 optimizers, PyTorch AMP's ``GradScaler`` for the scaling).

Why loss scaling (float16 only): float16's smallest normal number is 6e-5, so small
gradients flush to zero in the backward pass. The loss is multiplied by a large scale
(2**16 to start) before ``backward`` and the gradients divided by it in fp32; a step
whose gradients overflowed (inf / nan) is skipped and the scale halved, and after
``loss_scale_growth_interval`` good steps it is doubled again. bfloat16 has float32's
range and needs no scaling.

Free of torch: options modules mix :class:`PrecisionOptions` in to validate a config
(the optimizer that implements it is :mod:`rollart_sdk.backends.master_weights`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

LOW_PRECISION = ("bfloat16", "float16")


class PrecisionOptions(BaseModel):
    """Trainer options of mixed precision (mixed into a backend's options model)."""

    master_weights: Literal["auto"] | bool = Field(
        "auto",
        description="fp32 master weights and fp32 AdamW state for a bfloat16 / float16 model "
        "(model.dtype): the step runs on the fp32 copy, the model gets it rounded. auto: on "
        "for bfloat16 / float16, off for float32; false: step the low-precision weights "
        "directly (small updates round away)")
    master_rounding: Literal["auto", "nearest", "stochastic"] = Field(
        "auto",
        description="how the fp32 masters go into a bfloat16 model after each step: "
        "stochastic (up or down with the probability of the distance: the weights follow "
        "the masters on average from the first step) or nearest (a weight loaded in "
        "bfloat16 moves only once its updates add up to half a bfloat16 step: tens of "
        "steps at RL learning rates). auto: stochastic where the optimizer implements it, "
        "nearest otherwise (float16 weights are always rounded to nearest)")
    loss_scale: Literal["auto", "dynamic"] | float = Field(
        "auto",
        description="loss scaling: dynamic (start at loss_scale_init, halve and skip the step "
        "on inf/nan gradients, double after loss_scale_growth_interval good steps), or a "
        "fixed number (1 = none). auto: dynamic for float16, none otherwise")
    loss_scale_init: float = Field(
        2.0**16, gt=0, description="the dynamic loss scale's starting value")
    loss_scale_growth_interval: int = Field(
        1000, ge=1, description="good steps after which the dynamic loss scale doubles")

    @model_validator(mode="after")
    def _positive_scale(self) -> PrecisionOptions:
        if not isinstance(self.loss_scale, str) and not self.loss_scale > 0:
            raise ValueError(f"loss_scale must be auto, dynamic or a number > 0 (1 = no "
                             f"scaling), got {self.loss_scale!r}")
        return self

    def uses_master_weights(self, dtype: str) -> bool:
        """Whether a model in ``dtype`` is trained through fp32 master weights."""
        if self.master_weights == "auto":
            return dtype in LOW_PRECISION
        return bool(self.master_weights)

    def rounding(self) -> str:
        """``master_rounding`` for an optimizer that implements both: auto is stochastic."""
        return "nearest" if self.master_rounding == "nearest" else "stochastic"

    def loss_scaling(self, dtype: str) -> tuple[bool, float]:
        """``(dynamic, initial scale)`` for a model in ``dtype``; ``(False, 1.0)``: none."""
        if self.loss_scale == "auto":
            return (True, self.loss_scale_init) if dtype == "float16" else (False, 1.0)
        if self.loss_scale == "dynamic":
            return True, self.loss_scale_init
        return False, float(self.loss_scale)

    def precision_warnings(self, dtype: str, where: str = "trainer.options") -> list[str]:
        """What ``rollart validate`` says about a run of a model in ``dtype`` with these
        options: a low-precision model without master weights, float16 without scaling."""
        out = []
        if dtype in LOW_PRECISION and not self.uses_master_weights(dtype):
            out.append(
                f"model.dtype is {dtype} and {where}.master_weights is false: AdamW steps the "
                f"{dtype} weights directly, so updates smaller than the weights' resolution "
                f"(about |w| * {'2**-9' if dtype == 'bfloat16' else '2**-12'}; most updates "
                f"at lr {1e-6:g}-{1e-5:g}) round away without any error; set "
                f"{where}.master_weights to auto or true (fp32 master weights)")
        if dtype == "float16" and self.loss_scaling(dtype) == (False, 1.0):
            out.append(
                f"model.dtype is float16 and {where}.loss_scale is 1: gradients below "
                f"float16's range (about 6e-5) flush to zero; set {where}.loss_scale to "
                "auto or dynamic")
        return out
