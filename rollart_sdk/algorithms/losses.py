"""Token log-probabilities, the clipped policy loss, off-policy correction and KL.

Notation (per token ``t`` of sequence ``i``; ``m`` is the loss mask, 1 on tokens the
policy produced)::

    r      = exp(logp_theta - logp_old)                                 (ratio)
    l_PPO  = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))       (PPO-clip)
    w_TIS  = min(exp(logp_prox - logp_behaviour), cap), detached        (TIS)
    k1     = logp_theta - logp_ref
    k3     = exp(logp_ref - logp_theta) - (logp_ref - logp_theta) - 1   (>= 0)

    token-mean:  L = sum_{i,t} m l / sum_{i,t} m
    seq-mean:    L = mean_i ( sum_t m l / sum_t m )

All functions take ``[B, T]`` tensors (``advantages`` may be ``[B]``) and never reduce
over padding: everything is weighted by ``mask``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean"]
# Where a stale token's PPO ratio is anchored (decoupled_anchor).
StaleAnchor = Literal["proximal", "behaviour"]
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean")
# exp() of a log-ratio beyond this is treated as this (avoids inf * 0 = nan on
# a token whose probability collapsed between the behaviour and the current policy).
_MAX_LOG_RATIO = 20.0


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``log p(input_ids[:, t] | input_ids[:, :t])`` for ``t = 1..T-1``: shape ``[B, T-1]``.

    ``logits`` is the model output ``[B, T, V]`` (temperature 1, full vocabulary); the
    logits at position ``t`` predict token ``t + 1``, hence the shift. Computed as
    ``logit - logsumexp`` so no ``[B, T, V]`` log-softmax copy is kept.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"token_logprobs wants logits [B, T, V] and input_ids [B, T]; got "
            f"{tuple(logits.shape)} and {tuple(input_ids.shape)}"
        )
    pred = logits[:, :-1].float()
    target = input_ids[:, 1:].unsqueeze(-1)
    return pred.gather(-1, target).squeeze(-1) - torch.logsumexp(pred, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each next-token distribution, aligned with :func:`token_logprobs`:
    ``[B, T-1]``. A diagnostic (collapse of exploration); call it under ``no_grad``."""
    pred = logits[:, :-1].float()
    logp = torch.log_softmax(pred, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def aggregate(
    loss_per_token: torch.Tensor,
    mask: torch.Tensor,
    agg: Aggregation = "token-mean",
    normalizer: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar over the masked tokens.

    ``normalizer`` replaces the denominator (masked tokens for ``token-mean``, sequences
    with at least one masked token for ``seq-mean``). Trainers pass the count over the
    *whole* batch (all micro-batches, all data-parallel ranks), so that summing the
    micro-batch losses gives exactly the full-batch loss.
    """
    m = mask.to(loss_per_token.dtype)
    if agg == "token-mean":
        total = (loss_per_token * m).sum()
        denom = m.sum().clamp(min=1.0) if normalizer is None else normalizer
        return total / denom
    if agg == "seq-mean":
        per_seq = (loss_per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        if normalizer is None:
            normalizer = (m.sum(-1) > 0).sum().clamp(min=1).to(per_seq.dtype)
        return per_seq.sum() / normalizer
    raise ValueError(f"unknown loss aggregation {agg!r}; choose one of {', '.join(AGGREGATIONS)}")


def ppo_clip_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float | None = None,
    agg: Aggregation = "token-mean",
    is_weights: torch.Tensor | None = None,
    normalizer: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO clipped surrogate, as a loss to minimise.

    ``behaviour_logprobs`` is the policy the ratio is anchored to (the "old" policy).
    ``clip_eps_high`` defaults to ``clip_eps_low``; a larger one is DAPO's clip-higher.
    ``is_weights`` (``[B, T]``, detached) multiplies each token's loss: truncated
    importance weights for stale samples (:func:`truncated_is_weights`).

    Returns ``(loss, stats)``; stats are detached 0-d tensors, means over the masked
    tokens: ``clip_frac`` (tokens whose clipped branch is active, i.e. get no gradient),
    ``approx_kl`` (k3 estimate of KL(old || current)), ``ratio_mean``, ``ratio_max``,
    ``tokens`` (count).
    """
    if clip_eps_high is None:
        clip_eps_high = clip_eps_low
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype)
    log_ratio = (logprobs - behaviour_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights
    loss = aggregate(per_token, mask, agg, normalizer)

    with torch.no_grad():
        m = mask.bool()
        n = m.sum()
        denom = n.clamp(min=1).to(logprobs.dtype)
        r = ratio.detach()
        lr = log_ratio.detach()
        stats = {
            "clip_frac": ((clipped.detach() > unclipped.detach()) & m).sum() / denom,
            "approx_kl": (((r - 1.0) - lr) * m).sum() / denom,
            "ratio_mean": (r * m).sum() / denom,
            "ratio_max": torch.where(m, r, torch.zeros_like(r)).max() if n > 0 else r.new_zeros(()),
            "tokens": n.to(logprobs.dtype),
        }
    return loss, stats


def truncated_is_weights(
    logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance weights ``min(pi / mu, cap)``, detached (TIS).

    ``logprobs`` are the learner's log-probs of the sampled tokens (the proximal policy),
    ``behaviour_logprobs`` those of the policy that sampled them (an older version, or
    the inference engine's numerics). Truncating at ``cap`` bounds the variance that a
    stale sample can inject; detaching keeps it a weight, not a gradient path.
    """
    if cap <= 0:
        raise ValueError(f"TIS cap must be positive, got {cap}")
    log_w = (logprobs.detach() - behaviour_logprobs).clamp(max=math.log(cap))
    return torch.exp(log_w)


def decoupled_anchor(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    stale: torch.Tensor,
    mask: torch.Tensor,
    tis_cap: float = 2.0,
    tis_on_fresh: bool = False,
    stale_anchor: StaleAnchor = "proximal",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoupled PPO (AReaL): each token's anchor for the ratio, its importance weight, and
    the behaviour ratio ``pi_trainer / mu_engine`` (a diagnostic), all ``[B, T]``.

    ``stale_anchor="proximal"``: a ``stale`` token (sampled by an older policy version) is
    anchored at the current, proximal weights (``logprobs`` detached: ratio 1 at the
    update) and weighted by ``min(pi_prox / mu, tis_cap)`` (:func:`truncated_is_weights`);
    a fresh token is anchored at its behaviour log-prob with weight 1 (the same weights
    sampled it). ``tis_on_fresh`` treats every masked token as stale (corrects the
    engine's numerics too).

    ``stale_anchor="behaviour"``: a stale token is anchored at its behaviour log-prob too,
    weight 1, so its ratio is ``pi / mu``, clipped to ``1 +- clip_eps`` by the surrogate:
    PPO's trust region around the policy that sampled it. Where the ratio is inside the
    clip range the gradient is the proximal branch's untruncated (``r A grad log pi``);
    a token the updates since its sampling already moved past the range in its
    advantage's direction gets no further push. (With one update per batch the proximal
    anchor's ratio is 1 and its clip never binds: nothing limits how far stale data moves
    the policy.) ``tis_on_fresh`` then has nothing to correct: every token's ratio is to
    its behaviour log-prob.

    The behaviour ratio is over every masked token, 0 elsewhere. Every trainer backend
    computes its policy loss from these, so the correction is the same in all.
    """
    m = mask.bool()
    if stale_anchor == "behaviour":
        with torch.no_grad():
            ratio = torch.exp(logprobs.detach() - behaviour_logprobs).masked_fill(~m, 0.0)
        return behaviour_logprobs.detach(), torch.ones_like(behaviour_logprobs), ratio
    if stale_anchor != "proximal":
        raise ValueError(f"unknown stale_anchor {stale_anchor!r}; choose proximal or behaviour")
    corrected = m if tis_on_fresh else (stale & m)
    old = torch.where(corrected, logprobs.detach(), behaviour_logprobs)
    w = torch.where(corrected, truncated_is_weights(logprobs, behaviour_logprobs, tis_cap),
                    torch.ones_like(behaviour_logprobs))
    with torch.no_grad():
        ratio = torch.exp(logprobs.detach() - behaviour_logprobs).masked_fill(~m, 0.0)
    return old, w, ratio


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: Literal["k1", "k2", "k3"] = "k3",
) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate from sampled tokens (Schulman's k1/k2/k3).

    ``k1 = log pi - log pi_ref`` is unbiased but can be negative; ``k3`` is unbiased in
    expectation, always >= 0 and lower-variance (GRPO's choice); ``k2 = 0.5 k1^2``.
    The gradient flows through ``logprobs`` only.
    """
    diff = logprobs - ref_logprobs.detach()
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff * diff
    if kind == "k3":
        neg = (-diff).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")
