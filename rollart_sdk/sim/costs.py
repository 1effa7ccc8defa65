"""Cost models of the simulation: hardware classes, model sizes, distributions.

Everything here is a pure function of its inputs (no clock, no asyncio), so a test can
check a simulated duration against the formula by hand.

- :class:`HardwareClass` (plain config data, :mod:`rollart_sdk.config.sim`): peak dense
  bf16 FLOP/s, HBM bandwidth and memory of one device, with the fractions of peak a real kernel reaches (``mfu``, ``mbu``) and a fixed
  per-step overhead (scheduling, kernel launches). Built-ins: H800, H20, H100, A100;
  any class can be declared in the config (``sim.hardware``).
- :class:`ModelSpec`: parameter count and the attention shape that sets the KV-cache size
  per token. Presets: the Qwen3 sizes the paper trains.
- :func:`engine_step_s`: one continuous-batching step (roofline: the slower of compute and
  memory traffic): prefill tokens are FLOP-bound, a decode step reads every weight and the
  batch's KV cache once and is bandwidth-bound until the batch is large.
- :func:`train_step_s`: FLOPs per token (6 N forward + backward, 2 N for the old-logprob
  pass) plus attention over each sequence, spread over the training devices.
- :class:`Dist`: a distribution spec (constant, normal, lognormal, uniform) drawn with a
  seeded ``random.Random``.
"""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The plain types the config's `sim:` section validates (re-exported: the cost models'
# callers import them from here).
from rollart_sdk.config.sim import HARDWARE, MODELS, HardwareClass, ModelSpec

__all__ = ["HARDWARE", "MODELS", "Dist", "HardwareClass", "ModelSpec", "const",
           "engine_step_s", "kv_capacity_tokens", "prefill_pairs", "resolve_hardware",
           "train_step_s"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Dist(_Strict):
    """A distribution: ``const`` (``mean``), ``normal`` (``mean``, ``std``), ``lognormal``
    (its own ``mean`` and ``std``, a long right tail), ``uniform`` (``low``..``high``);
    every draw clipped to ``[min, max]``."""

    kind: Literal["const", "normal", "lognormal", "uniform"] = "const"
    mean: float = 0.0
    std: float = Field(0.0, ge=0)
    low: float = 0.0
    high: float = 0.0
    min: float = 0.0
    max: float = math.inf

    @model_validator(mode="after")
    def _check(self) -> Dist:
        if self.kind == "lognormal" and self.mean <= 0:
            raise ValueError("a lognormal needs mean > 0")
        if self.kind == "uniform" and self.high < self.low:
            raise ValueError("uniform needs high >= low")
        return self

    def draw(self, rng: random.Random) -> float:
        if self.kind == "const":
            x = self.mean
        elif self.kind == "normal":
            x = rng.gauss(self.mean, self.std)
        elif self.kind == "lognormal":
            s2 = math.log(1 + (self.std / self.mean) ** 2)
            x = rng.lognormvariate(math.log(self.mean) - s2 / 2, math.sqrt(s2))
        else:
            x = rng.uniform(self.low, self.high)
        return min(max(x, self.min), self.max)

    def draw_int(self, rng: random.Random, at_least: int = 0) -> int:
        return max(at_least, int(round(self.draw(rng))))


def const(x: float) -> Dist:
    return Dist(kind="const", mean=x)


def resolve_hardware(name: str, declared: dict[str, HardwareClass]) -> HardwareClass:
    """A pool's hardware class: declared in the config, else built in."""
    if name in declared:
        return declared[name]
    if name in HARDWARE:
        return HARDWARE[name]
    known = sorted(set(HARDWARE) | set(declared))
    raise ValueError(
        f"no cost model for hardware {name!r}; declare it under sim.hardware "
        f"(tflops, hbm_tbps, memory_gb) or use one of: {', '.join(known)}"
    )


# ----------------------------------------------------------------------------- engines
def engine_step_s(hw: HardwareClass, devices: int, model: ModelSpec, prefill_tokens: float,
                  prefill_context: float, decode_batch: int, decode_context: float,
                  prefill_seqs: int = 0) -> float:
    """Seconds of one engine step that prefills ``prefill_tokens`` new tokens (attending
    to ``prefill_context`` token pairs in all) and decodes one token for each of
    ``decode_batch`` requests whose contexts sum to ``decode_context`` tokens.

    Roofline: max(FLOPs / FLOP/s, bytes moved / bandwidth) + the step overhead. FLOPs are
    2 N per token plus 4 x layers x width per attended token pair; bytes are the weights
    (read once per step) plus the KV cache the step reads. ``seq_overhead_s`` per
    sequence in the step (``decode_batch + prefill_seqs``) is host-side work (0 on the
    built-in GPU classes; a CPU engine fitted by calibration has a large one)."""
    if prefill_tokens <= 0 and decode_batch <= 0:
        return 0.0
    tokens = prefill_tokens + decode_batch
    attn_pairs = prefill_context + decode_context
    flop = 2 * model.active_params * tokens + 4 * model.layers * model.hidden * attn_pairs
    moved = model.weight_bytes + model.kv_bytes_per_token * (decode_context + prefill_tokens)
    roof = max(flop / (hw.flops * devices), moved / (hw.bandwidth * devices))
    return roof + hw.step_overhead_s + hw.seq_overhead_s * (decode_batch + prefill_seqs)


def prefill_pairs(new_tokens: float, cached: float) -> float:
    """Attention pairs of prefilling ``new_tokens`` after ``cached`` tokens (causal)."""
    return new_tokens * cached + new_tokens * (new_tokens + 1) / 2


def kv_capacity_tokens(hw: HardwareClass, devices: int, model: ModelSpec) -> int:
    """Tokens of KV cache an engine of ``devices`` devices holds beside its weights."""
    free = hw.memory_gb * 1e9 * devices * hw.kv_memory_fraction - model.weight_bytes
    if free <= 0:
        raise ValueError(
            f"a {model.params_b:g}B model ({model.weight_bytes / 1e9:.0f} GB) does not fit "
            f"on {devices} device(s) of {hw.memory_gb:g} GB; raise the engine's "
            "devices (sim.engine_devices)"
        )
    return int(free / model.kv_bytes_per_token)


# ----------------------------------------------------------------------------- trainer
def train_step_s(hw: HardwareClass, devices: int, model: ModelSpec,
                 seq_lengths: list[int], flops_per_token_factor: float = 8.0,
                 overhead_s: float = 0.0) -> float:
    """Seconds of one optimiser step over sequences of ``seq_lengths`` tokens on
    ``devices`` devices: ``factor`` x N FLOPs per token (6 for forward + backward, 2 for
    recomputing the old log-probabilities) plus causal attention, at ``mfu``."""
    tokens = float(sum(seq_lengths))
    pairs = sum(n * (n + 1) / 2 for n in seq_lengths)
    flop = flops_per_token_factor * (model.active_params * tokens
                                     + 2 * model.layers * model.hidden * pairs)
    return flop / (hw.flops * devices) + overhead_s
