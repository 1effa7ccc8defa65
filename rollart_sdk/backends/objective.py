"""The decoupled PPO objective every trainer backend computes, and its statistics.

:func:`decoupled_ppo_objective` turns one micro-batch's log-probs into the loss to
backpropagate: a token sampled by an older policy version (stale) is anchored at the
current, proximal weights and weighted by ``min(pi_prox / mu, tis_cap)``; a fresh one is
anchored at its behaviour log-prob (:func:`~rollart_sdk.algorithms.decoupled_anchor`);
the PPO-clip surrogate (:func:`~rollart_sdk.algorithms.ppo_clip_loss`) plus an optional
KL to a frozen reference (``kl_coef``), both divided by the whole batch's ``normalizer``.
:class:`LossStats` sums what the step reports (clip fraction, approximate KL, ratio,
entropy, stale fraction, importance weights, behaviour ratio, train/inference mismatch)
over micro-batches, reduces it over ranks and turns it into the step's metrics. Trainers
``torch`` and ``megatron`` both call these, so the two compute the same update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from rollart_sdk.algorithms import aggregate, decoupled_anchor, kl_penalty, ppo_clip_loss


class ObjectiveOptions(Protocol):
    """The options the objective reads (:class:`~rollart_sdk.backends.trainer_options.
    TrainerOptionsBase` has them)."""

    clip_eps: float
    clip_eps_high: float | None
    tis_cap: float
    tis_on_fresh: bool
    stale_anchor: Literal["proximal", "behaviour"]
    kl_coef: float
    kl_kind: Literal["k1", "k2", "k3"]


@dataclass
class Objective:
    """One micro-batch's objective: ``loss`` (what ``backward`` runs on) and what
    :class:`LossStats` reads. ``old`` and ``weights`` are the anchors (detached), kept by
    a trainer that takes several passes over a batch; ``behaviour_ratio`` is ``pi / mu``
    (``None`` when the anchors were given)."""

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor | None
    clip: dict[str, torch.Tensor]
    logp: torch.Tensor
    behaviour: torch.Tensor
    mask: torch.Tensor
    stale: torch.Tensor
    old: torch.Tensor
    weights: torch.Tensor
    behaviour_ratio: torch.Tensor | None
    # The tokens whose weight is a truncated importance weight: the stale ones, every
    # trained one with ``tis_on_fresh`` under the proximal anchor (``tis_weight_mean``).
    corrected: torch.Tensor


def decoupled_ppo_objective(
    logp: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    versions: torch.Tensor,
    version: int,
    opts: ObjectiveOptions,
    normalizer: float,
    *,
    agg: Literal["token-mean", "seq-mean"] = "token-mean",
    token_weights: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    anchor: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Objective:
    """The decoupled PPO-clip loss of one micro-batch (``[B, T]`` tensors over the
    predicted positions: ``logp`` the current policy's log-probs, ``behaviour`` the
    engine's, ``mask`` the trained tokens, ``versions`` the policy version that sampled
    each token; ``advantages`` ``[B]`` or ``[B, T]``).

    ``agg`` and ``normalizer``: how token losses add up (:func:`~rollart_sdk.algorithms.
    aggregate`; ``normalizer`` counts the whole batch on every rank, so micro-batch losses
    add up to the batch's). ``token_weights`` multiplies each token's loss and KL (packed
    rows: ``1 / tokens of its sequence`` for a sequence mean). ``ref_logp``: the frozen
    reference's log-probs, for the KL term (``opts.kl_coef``). ``anchor``: a later pass
    over the same batch keeps the first pass's ``(old, weights)``."""
    m = mask.bool()
    stale = (versions < version) & m
    corrected = m if (opts.tis_on_fresh and opts.stale_anchor == "proximal") else stale
    ratio = None
    if anchor is None:
        old, w, ratio = decoupled_anchor(logp, behaviour, stale, m, opts.tis_cap,
                                         opts.tis_on_fresh, opts.stale_anchor)
        old, w = old.detach(), w.detach()
    else:
        old, w = anchor
    pg_loss, clip = ppo_clip_loss(
        logp, old, advantages, mask, opts.clip_eps, opts.clip_eps_high, agg,
        is_weights=w if token_weights is None else w * token_weights, normalizer=normalizer,
    )
    loss, kl = pg_loss, None
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, opts.kl_kind)
        kl_tok = kl if token_weights is None else kl * token_weights
        loss = loss + opts.kl_coef * aggregate(kl_tok, mask, agg, normalizer)
    return Objective(loss, pg_loss, kl, clip, logp, behaviour, mask, stale, old, w, ratio,
                     corrected)


SUMS = ("loss", "pg_loss", "kl", "clip", "approx_kl", "ratio", "entropy", "stale", "tis_w",
        "corrected", "tokens", "beh_ratio", "mismatch", "fresh", "last_clip")
MAXIMA = ("ratio", "beh_ratio", "mismatch")
# reduce(tensor, op) sums ("sum") or takes the maximum ("max") of a small tensor over ranks
Reduce = Callable[[torch.Tensor, str], torch.Tensor]


@dataclass
class LossStats:
    """A step's sums over tokens and maxima, added micro-batch by micro-batch
    (:meth:`add`), then reduced over ranks (:meth:`reduce`) and turned into metrics
    (:meth:`metrics`). A backend may track more keys (``extra_sums``/``extra_maxima``):
    they are reduced along."""

    extra_sums: Sequence[str] = ()
    extra_maxima: Sequence[str] = ()
    sums: dict[str, float] = field(init=False)
    maxima: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.sums = dict.fromkeys((*SUMS, *self.extra_sums), 0.0)
        self.maxima = dict.fromkeys((*MAXIMA, *self.extra_maxima), 0.0)

    def add(self, obj: Objective, entropy: float) -> None:
        """A micro-batch of the first (or only) pass; ``entropy`` its summed entropy."""
        s, top = self.sums, self.maxima
        ntok = float(obj.clip["tokens"])
        s["loss"] += float(obj.loss.detach())
        s["pg_loss"] += float(obj.pg_loss.detach())
        if obj.kl is not None:
            s["kl"] += float((obj.kl.detach() * obj.mask).sum())
        s["clip"] += float(obj.clip["clip_frac"]) * ntok
        s["approx_kl"] += float(obj.clip["approx_kl"]) * ntok
        s["ratio"] += float(obj.clip["ratio_mean"]) * ntok
        s["stale"] += float(obj.stale.sum())
        s["tis_w"] += float((obj.weights * obj.corrected).sum())
        s["corrected"] += float(obj.corrected.sum())
        s["tokens"] += ntok
        s["entropy"] += entropy
        top["ratio"] = max(top["ratio"], float(obj.clip["ratio_max"]))
        m = obj.mask.bool()
        if obj.behaviour_ratio is not None:
            s["beh_ratio"] += float(obj.behaviour_ratio.sum())
            if bool(m.any()):
                top["beh_ratio"] = max(top["beh_ratio"], float(obj.behaviour_ratio.max()))
        # train/inference mismatch: engine vs trainer log-prob on fresh tokens (same weights)
        fresh = (m & ~obj.stale).float()
        gap = (obj.logp.detach() - obj.behaviour).abs() * fresh
        s["mismatch"] += float(gap.sum())
        s["fresh"] += float(fresh.sum())
        if bool(fresh.any()):
            top["mismatch"] = max(top["mismatch"], float(gap.max()))

    def rescale_losses(self, factor: float) -> None:
        """The losses added so far, divided by a new normaliser: ``factor`` = old / new
        (a step added up from parts, each divided by the count of the parts so far)."""
        self.sums["loss"] *= factor
        self.sums["pg_loss"] *= factor

    def add_last(self, obj: Objective) -> None:
        """A micro-batch of a batch's last pass (of several): its clip fraction."""
        self.sums["last_clip"] += float(obj.clip["clip_frac"]) * float(obj.clip["tokens"])

    def reduce(self, reduce: Reduce) -> None:
        """Sums and maxima over ranks (``reduce(tensor, "sum" | "max")``)."""
        keys = list(self.sums)
        summed = reduce(torch.tensor([self.sums[k] for k in keys], dtype=torch.float64), "sum")
        self.sums = dict(zip(keys, summed.tolist(), strict=True))
        keys = list(self.maxima)
        top = reduce(torch.tensor([self.maxima[k] for k in keys]), "max")
        self.maxima = dict(zip(keys, top.tolist(), strict=True))

    def metrics(self, compute_entropy: bool) -> dict[str, float]:
        """The step's loss metrics: per-token means over the tokens run (NaN over none)."""
        s, top = self.sums, self.maxima
        ntok = max(s["tokens"], 1.0)

        def mean(key: str) -> float:  # per token run; a mean over no token is no number
            return s[key] / s["tokens"] if s["tokens"] else float("nan")

        return {
            "loss": s["loss"],
            "pg_loss": s["pg_loss"],
            "kl": s["kl"] / ntok,
            "clip_frac": s["clip"] / ntok,
            "approx_kl": s["approx_kl"] / ntok,
            "ratio_mean": mean("ratio"),
            "ratio_max": top["ratio"],
            "entropy": mean("entropy") if compute_entropy else float("nan"),
            "stale_frac": s["stale"] / ntok,
            # over the tokens it weights (stale ones; every one with tis_on_fresh)
            "tis_weight_mean": s["tis_w"] / max(s["corrected"], 1.0),
            "behaviour_ratio_mean": mean("beh_ratio"),
            "behaviour_ratio_max": top["beh_ratio"],
            # |engine - trainer| log-prob on fresh tokens (rollart_sdk.algorithms.policy)
            "mismatch_mean": s["mismatch"] / s["fresh"] if s["fresh"] else float("nan"),
            "mismatch_max": top["mismatch"] if s["fresh"] else float("nan"),
            "mismatch_tokens": s["fresh"],
        }
