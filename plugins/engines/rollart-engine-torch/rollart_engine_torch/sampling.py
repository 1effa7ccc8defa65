"""Token choice for one sequence, from its fp32 logits row.

The logprob reported with each token is ``log_softmax(logits)[token]`` of the UNMODIFIED
distribution (temperature 1, no top-k/top-p, no allowed-ids mask). That is exactly what
a trainer recomputes with a plain forward pass, so the PPO/GRPO importance ratio compares
like with like and the conformance kit can check it against a teacher-forced pass.
Sampling itself uses the modified distribution (mask here, then temperature, top-k,
top-p in the core's ``rollart_sdk.algorithms.draw``).

Randomness comes only from the request's own ``torch.Generator``, so a seeded request
samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch

from rollart_sdk.algorithms import draw
from rollart_sdk.types import SamplingParams


def choose_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    allowed: torch.Tensor | None = None,
) -> int:
    """Pick the next token id from ``logits`` (1-D, fp32) under ``params``."""
    x = logits
    if allowed is not None:
        masked = torch.full_like(x, float("-inf"))
        masked[allowed] = x[allowed]
        x = masked
    return draw(x, params, generator)
