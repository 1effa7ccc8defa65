"""Token choice for one sequence, from its fp32 logits row.

The logprob reported with each token is ``log_softmax(logits)[token]`` of the UNMODIFIED
distribution (temperature 1, no top-k/top-p, no allowed-ids mask). That is exactly what
a trainer recomputes with a plain forward pass, so the PPO/GRPO importance ratio compares
like with like and the conformance kit can check it against a teacher-forced pass.
Sampling itself uses the modified distribution (mask, temperature, top-k, top-p).

Randomness comes only from the request's own ``torch.Generator``, so a seeded request
samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch

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
    if params.temperature <= 0:
        return int(torch.argmax(x))
    x = x / params.temperature
    if params.top_k and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Drop a token when the mass BEFORE it already reaches top_p (keeps at least one).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(0, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
