"""The next-token draw every sampling engine shares: temperature, top-k, top-p, then one
draw from the request's own ``torch.Generator``.

An engine that samples itself (the torch engine on its logits; the SGLang adapter on the
full-vocabulary log-probs of a constrained request's allowed ids, which differ from the
logits by one constant per position) calls :func:`draw`, so both draw the same index from
the same scores and generator state. Masks (allowed ids) are the caller's: give them as
``-inf`` scores or pass only the allowed scores.
"""

from __future__ import annotations

import torch

from rollart_sdk.types import SamplingParams


def filter_scores(scores: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``scores`` (1-D) divided by ``params.temperature`` (> 0), with every id outside the
    top-k and outside the smallest prefix whose mass reaches top-p (at least one id) set
    to ``-inf``. The dtype of ``scores`` is kept."""
    if params.temperature <= 0:
        raise ValueError(
            f"filter_scores needs a temperature > 0, got {params.temperature}; "
            "temperature 0 is greedy (draw() takes the argmax)"
        )
    x = scores / params.temperature
    if params.top_k and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Drop an id when the mass BEFORE it already reaches top_p (keeps at least one).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(0, order, sorted_x)
    return x


def draw(scores: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The index drawn from ``scores`` (1-D logits or log-probs) under ``params``: the
    argmax at temperature 0 (the generator is not used), else one multinomial draw from
    ``softmax(filter_scores(scores, params))`` with ``generator``."""
    if params.temperature <= 0:
        return int(torch.argmax(scores))
    probs = torch.softmax(filter_scores(scores, params), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
