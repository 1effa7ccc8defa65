"""Learning-rate schedules: the factor that multiplies a trainer's base ``lr`` at a step,
and the options every trainer backend takes for it (:class:`LRScheduleOptions`).

A pure function of the step count, so a trainer resumed from a checkpoint (which stores
its step) continues the same schedule without any scheduler state. Free of torch: options
modules import it to validate a config.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, model_validator

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, schedule: str = "constant", warmup_steps: int = 0,
              decay_steps: int | None = None, min_ratio: float = 0.0) -> float:
    """The factor of the base learning rate for optimiser step ``step`` (0 = the first).

    - warm-up: ``(step + 1) / warmup_steps`` over the first ``warmup_steps`` steps;
    - ``constant``: 1 afterwards;
    - ``linear`` / ``cosine``: from 1 down to ``min_ratio`` over the steps from
      ``warmup_steps`` to ``decay_steps`` (``min_ratio`` from then on), the shape TRL /
      Hugging Face ``Trainer`` use by default (``linear``, ``min_ratio`` 0).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; use one of {list(SCHEDULES)}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if decay_steps is None or decay_steps <= warmup_steps:
        raise ValueError(f"lr schedule {schedule!r} needs decay_steps > warmup_steps "
                         f"({warmup_steps}), got {decay_steps}")
    progress = min(1.0, (step - warmup_steps) / (decay_steps - warmup_steps))
    if schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


class LRScheduleOptions(BaseModel):
    """Trainer options of the schedule (mixed into a backend's options model): constant,
    or linear / cosine decay from ``lr`` to ``lr * lr_min_ratio`` at step
    ``lr_decay_steps`` (e.g. the run's ``train.steps``), after ``lr_warmup_steps`` of
    linear warm-up."""

    lr_schedule: Literal["constant", "linear", "cosine"] = Field("constant", description=(
        "learning-rate schedule after warm-up: constant, or linear / cosine decay from lr "
        "to lr * lr_min_ratio at step lr_decay_steps"))
    lr_warmup_steps: int = Field(0, ge=0, description=(
        "linear warm-up steps: lr * (step + 1) / lr_warmup_steps over the first steps"))
    lr_decay_steps: int | None = Field(None, ge=1, description=(
        "step where linear / cosine decay ends (above lr_warmup_steps); usually the run's "
        "train.steps"))
    lr_min_ratio: float = Field(0.0, ge=0, le=1, description=(
        "where the decay ends, as a fraction of lr"))

    @model_validator(mode="after")
    def _decay_steps(self) -> LRScheduleOptions:
        if self.lr_schedule != "constant" and (
                self.lr_decay_steps is None or self.lr_decay_steps <= self.lr_warmup_steps):
            raise ValueError(
                f"lr_schedule {self.lr_schedule!r} decays over lr_decay_steps, which must be "
                f"set above lr_warmup_steps ({self.lr_warmup_steps}), got "
                f"{self.lr_decay_steps}: e.g. lr_decay_steps equal to the run's train.steps")
        return self

    def lr_at(self, base_lr: float, step: int) -> float:
        """The learning rate of optimiser step ``step`` (0 = the first)."""
        return base_lr * lr_factor(step, self.lr_schedule, self.lr_warmup_steps,
                                   self.lr_decay_steps, self.lr_min_ratio)
