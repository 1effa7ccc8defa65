"""Token choice for one sequence, from its fp32 logits row.

The logprob reported with each token is that of the sampled policy,
``log_softmax(mask(logits) / temperature)[token]`` (the core's
:mod:`rollart_sdk.algorithms.policy`: the allowed-ids mask and the temperature, greedy
taken as temperature 1). That is exactly what a trainer recomputes, so the PPO/GRPO
importance ratio compares the distribution the token was drawn from with the one being
optimised, and the conformance kit checks it against a teacher-forced pass. The draw
itself also applies top-k and top-p (the core's ``rollart_sdk.algorithms.draw``), which
the policy does not model (as in verl).

Randomness comes only from the request's own ``torch.Generator``, so a seeded request
samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch

from rollart_sdk.algorithms import draw, policy_scores
from rollart_sdk.types import SamplingParams


def choose_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    allowed: torch.Tensor | None = None,
) -> tuple[int, float]:
    """Pick the next token id from ``logits`` (1-D, fp32) under ``params``; returns it
    with its log-prob under the sampled policy (mask and temperature), or under the raw
    distribution with ``params.raw_logprobs``."""
    x = logits
    if allowed is not None:
        masked = torch.full_like(x, float("-inf"))
        masked[allowed] = x[allowed]
        x = masked
    tok = draw(x, params, generator)
    if params.raw_logprobs:  # scoring: the raw distribution's log p(token)
        return tok, float(logits[tok] - torch.logsumexp(logits, dim=-1))
    scores = policy_scores(x, params.temperature)
    return tok, float(scores[tok] - torch.logsumexp(scores, dim=-1))
