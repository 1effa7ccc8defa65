"""The algorithm layer: pure functions on torch tensors (advantages, policy losses,
off-policy correction), shared by every trainer backend, the next-token draw shared by
the engines that sample themselves, and the sampled policy (``policy``: temperature and
action mask) that engines report and trainers recompute.

Each function does one thing and is unit-tested on hand-computed numbers
(``tests/algorithms``). Importing this package imports torch, so the core imports it
only where training happens (trainer workers, and the pipeline when it fills
advantages), never at plugin registration.
"""

from rollart_sdk.algorithms.advantages import fill_advantages, grpo_advantages
from rollart_sdk.algorithms.losses import (
    AGGREGATIONS,
    aggregate,
    decoupled_anchor,
    kl_penalty,
    ppo_clip_loss,
    token_entropy,
    token_logprobs,
    truncated_is_weights,
)
from rollart_sdk.algorithms.policy import (
    AllowedMassMeter,
    MismatchMeter,
    allowed_groups,
    policy_logprob,
    policy_scores,
    policy_temperature,
    policy_token_logprobs,
)
from rollart_sdk.algorithms.sampling import draw, filter_scores

__all__ = [
    "AGGREGATIONS",
    "AllowedMassMeter",
    "MismatchMeter",
    "aggregate",
    "allowed_groups",
    "decoupled_anchor",
    "draw",
    "filter_scores",
    "fill_advantages",
    "grpo_advantages",
    "kl_penalty",
    "policy_logprob",
    "policy_scores",
    "policy_temperature",
    "policy_token_logprobs",
    "ppo_clip_loss",
    "token_entropy",
    "token_logprobs",
    "truncated_is_weights",
]
