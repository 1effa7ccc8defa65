"""The sampled policy: the distribution a token was drawn from, and the one trainers
recompute. Engines and trainers both call these functions, so the two agree by
construction.

For a request with temperature ``T`` and (optionally) an action vocabulary ``A``
(``allowed_token_ids``, an environment's constrained actions) the policy is::

    pi(a | s) = softmax(mask_A(logits) / T)[a]

``mask_A`` sets every id outside ``A`` to ``-inf``. A temperature of 0 (greedy) is taken
as 1: a greedy draw has no distribution of its own, and greedy rollouts are for
evaluation, not training.

What is *not* part of the policy: top-k and top-p. Engines draw from the truncated
distribution but report (and trainers recompute) the log-prob under ``pi`` above, as verl
does (its actor divides the logits by the rollout temperature and ignores top-k/top-p).
Truncation changes which tokens can be drawn, and no trainer in the field models it;
``rollart validate`` warns when a trained task samples with top-k or top-p, and the
engine-trainer mismatch metric (``train/mismatch_*``) shows what it costs.

Why this matters: a trainer that recomputes log-probs of the raw logits while the
engine samples at temperature 0.7 or among a few allowed ids optimises a different
distribution from the one that generated the data. With ``constrain_actions`` the
difference is the whole action mass: a model can move all its probability onto a token
the sampler never draws (issue #38's Bulls-and-Cows run) while the loss keeps falling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

import torch


def policy_temperature(temperature: float) -> float:
    """The temperature of the policy a request samples: ``temperature`` when > 0, else 1
    (greedy)."""
    return float(temperature) if temperature > 0 else 1.0


def policy_scores(
    logits: torch.Tensor, temperature: float, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """``mask_A(logits) / T`` over the last dimension: the scores whose softmax is the
    policy. ``allowed`` (1-D long tensor of ids) masks every other id to ``-inf``."""
    x = logits.float()
    if allowed is not None:
        masked = torch.full_like(x, float("-inf"))
        masked[..., allowed] = x[..., allowed]
        x = masked
    t = policy_temperature(temperature)
    return x if t == 1.0 else x / t


def policy_logprob(
    logits: torch.Tensor, token: int, temperature: float, allowed: torch.Tensor | None = None
) -> float:
    """``log pi(token)`` for one position (``logits`` 1-D): what an engine reports."""
    x = policy_scores(logits, temperature, allowed)
    return float(x[token] - torch.logsumexp(x, dim=-1))


@overload
def policy_token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None = ...,
    groups: torch.Tensor | None = ..., allowed: Sequence[torch.Tensor] = ...,
    entropy: bool = ..., allowed_mass: Literal[False] = ...,
) -> tuple[torch.Tensor, float]: ...


@overload
def policy_token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None = ...,
    groups: torch.Tensor | None = ..., allowed: Sequence[torch.Tensor] = ...,
    entropy: bool = ..., *, allowed_mass: Literal[True],
) -> tuple[torch.Tensor, float, torch.Tensor]: ...


def policy_token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor | None = None,
    groups: torch.Tensor | None = None,
    allowed: Sequence[torch.Tensor] = (),
    entropy: bool = False,
    allowed_mass: bool = False,
) -> tuple[torch.Tensor, float] | tuple[torch.Tensor, float, torch.Tensor]:
    """``log pi(targets)`` for rows of logits: what a trainer recomputes.

    ``logits`` ``[N, V]`` (any float dtype; computed in fp32), ``targets`` ``[N]``.
    ``temperature`` ``[N]`` (already mapped through :func:`policy_temperature`) or None for
    1 everywhere. ``groups`` ``[N]`` long: ``-1`` for an unconstrained row, ``g`` for a row
    constrained to ``allowed[g]``. Returns the log-probs ``[N]`` (differentiable) and, with
    ``entropy``, the summed entropy of the rows' policies (a float, no gradient).

    A constrained row's normaliser is the log-sum-exp over its allowed ids only (gathered,
    so no masked ``[N, V]`` copy is made).

    ``allowed_mass=True`` adds a third value, ``[N]`` without gradient: for each
    constrained row the log of the probability mass the *unmasked* policy puts on its
    allowed ids, ``logsumexp(x[A]) - logsumexp(x)`` with ``x = logits / T`` (the row's
    own sampling temperature, the distribution the engine masks); NaN on an
    unconstrained row. A model that moved its mass onto a token outside the action
    vocabulary (issue #38) shows it here while its masked log-probs look healthy. It
    costs one more log-sum-exp over the vocabulary on the constrained rows only.
    """
    x = logits.float()
    if temperature is not None:
        x = x / temperature.to(x.dtype).unsqueeze(-1)
    picked = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if groups is None or not allowed or not bool((groups >= 0).any()):
        log_z = torch.logsumexp(x, dim=-1)
        ent = _entropy(x, log_z) if entropy else 0.0
        if allowed_mass:
            return picked - log_z, ent, torch.full_like(picked.detach(), float("nan"))
        return picked - log_z, ent
    log_z = torch.zeros_like(picked)
    ent = 0.0
    free = (groups < 0).nonzero(as_tuple=True)[0]
    if free.numel():
        xf = x[free]
        zf = torch.logsumexp(xf, dim=-1)
        log_z = log_z.index_put((free,), zf)
        ent += _entropy(xf, zf) if entropy else 0.0
    for g, ids in enumerate(allowed):
        rows = (groups == g).nonzero(as_tuple=True)[0]
        if not rows.numel():
            continue
        sub = x[rows][:, ids.to(x.device)]
        zg = torch.logsumexp(sub, dim=-1)
        log_z = log_z.index_put((rows,), zg)
        ent += _entropy(sub, zg) if entropy else 0.0
    if allowed_mass:
        with torch.no_grad():
            constrained = (groups >= 0).nonzero(as_tuple=True)[0]
            mass = torch.full_like(picked.detach(), float("nan"))
            full = torch.logsumexp(x.detach()[constrained], dim=-1)
            mass = mass.index_put((constrained,), log_z.detach()[constrained] - full)
        return picked - log_z, ent, mass
    return picked - log_z, ent


def _entropy(scores: torch.Tensor, log_z: torch.Tensor) -> float:
    """Summed entropy of the softmax of each row of ``scores`` (normaliser ``log_z``)."""
    with torch.no_grad():
        lp = scores.detach() - log_z.detach().unsqueeze(-1)
        return float(-(lp.exp() * lp).sum())


def allowed_groups(
    sets: Sequence[Sequence[int] | None],
) -> tuple[list[int], list[torch.Tensor]]:
    """Index each sample's allowed-id set: ``(group per sample, distinct sets)``, group
    ``-1`` for a sample without one. Samples of one task share one set, so a batch has
    as many groups as constrained tasks."""
    index: dict[tuple[int, ...], int] = {}
    out: list[int] = []
    for s in sets:
        if s is None:
            out.append(-1)
            continue
        key = tuple(sorted(set(s)))
        out.append(index.setdefault(key, len(index)))
    return out, [torch.tensor(k, dtype=torch.long) for k in index]


class MismatchMeter:
    """Train/inference mismatch: ``|engine log-prob - trainer log-prob|`` over the tokens
    whose behaviour policy has the trainer's current weights (fresh tokens, before the
    update), so that the only difference is numerical (kernels, precision, a policy the
    engine applied differently). Kept per engine worker; ``metrics()`` gives the step's
    ``mismatch_mean`` / ``mismatch_max`` over all of them and per worker
    (``train/mismatch_mean/<worker>``). A run whose policy drifts from what the engines
    sample shows it here first (values of 1e-3 and below are kernel noise; 0.1 and above
    mean the two are not computing the same distribution)."""

    def __init__(self) -> None:
        self.by_engine: dict[str, list[float]] = {}  # name -> [sum, tokens, max]

    def add(self, trainer_lp: torch.Tensor, behaviour_lp: torch.Tensor, fresh: torch.Tensor,
            engines: Sequence[str]) -> None:
        """Rows of ``[B, T]`` log-probs; ``fresh`` marks the tokens to compare;
        ``engines[b]`` names the worker of row ``b``."""
        with torch.no_grad():
            diff = (trainer_lp.detach().float() - behaviour_lp.float()).abs() * fresh
            sums, counts = diff.sum(-1).tolist(), fresh.sum(-1).tolist()
            maxes = diff.max(-1).values.tolist() if diff.numel() else [0.0] * len(engines)
        for name, s, n, mx in zip(engines, sums, counts, maxes, strict=True):
            if not n:
                continue
            acc = self.by_engine.setdefault(name or "engine", [0.0, 0.0, 0.0])
            acc[0] += s
            acc[1] += n
            acc[2] = max(acc[2], mx)

    def merge(self, others: Sequence[dict[str, list[float]]]) -> None:
        """Add other ranks' ``by_engine`` (gathered with ``all_gather_object``)."""
        for other in others:
            for name, (s, n, mx) in other.items():
                acc = self.by_engine.setdefault(name, [0.0, 0.0, 0.0])
                acc[0] += s
                acc[1] += n
                acc[2] = max(acc[2], mx)

    def metrics(self) -> dict[str, float]:
        total = sum(a[1] for a in self.by_engine.values())
        nan = float("nan")
        out = {
            "mismatch_mean": (sum(a[0] for a in self.by_engine.values()) / total
                              if total else nan),
            "mismatch_max": max((a[2] for a in self.by_engine.values()), default=nan),
            "mismatch_tokens": float(total),
        }
        if len(self.by_engine) > 1:
            for name, (s, n, mx) in sorted(self.by_engine.items()):
                out[f"train/mismatch_mean/{name}"] = s / n
                out[f"train/mismatch_max/{name}"] = mx
        return out


class AllowedMassMeter:
    """Where actions are constrained: the probability mass the unmasked policy puts on
    the allowed ids (``policy_token_logprobs(..., allowed_mass=True)``), per task, over
    the trained positions of a step. ``metrics()`` gives ``allowed_mass_mean`` and
    ``allowed_mass_min`` over every constrained position, ``allowed_mass/<task>`` (the
    mean per task) and ``allowed_mass_uniform/<task>`` (what a policy with no preference
    would put there: allowed ids / vocabulary); nothing when no position was constrained.
    Near 1: the model itself prefers the action words; near 0, and below the uniform
    share: its mass is elsewhere and the constrained sampler draws from the tail of its
    distribution, whatever the observation (issue #38)."""

    def __init__(self) -> None:
        # tag -> [sum of mass, positions, min, uniform share]
        self.by_task: dict[str, list[float]] = {}

    def add(self, log_mass: torch.Tensor, tags: Sequence[str],
            uniform: Sequence[float] | None = None) -> None:
        """``log_mass`` ``[N]`` (NaN on unconstrained rows), ``tags[i]`` row ``i``'s task,
        ``uniform[i]`` its allowed ids' share of the vocabulary (NaN: unknown)."""
        with torch.no_grad():
            keep = ~torch.isnan(log_mass)
            if not bool(keep.any()):
                return
            mass = log_mass[keep].exp().tolist()
            rows = keep.nonzero(as_tuple=True)[0].tolist()
        for i, m in zip(rows, mass, strict=True):
            acc = self.by_task.setdefault(tags[i], [0.0, 0.0, 1.0, float("nan")])
            acc[0] += m
            acc[1] += 1
            acc[2] = min(acc[2], m)
            if uniform is not None:
                acc[3] = float(uniform[i])

    def merge(self, others: Sequence[dict[str, list[float]]]) -> None:
        """Add other ranks' ``by_task`` (gathered with ``all_gather_object``)."""
        for other in others:
            for tag, (s, n, mn, share) in other.items():
                acc = self.by_task.setdefault(tag, [0.0, 0.0, 1.0, float("nan")])
                acc[0] += s
                acc[1] += n
                acc[2] = min(acc[2], mn)
                if share == share:  # not NaN
                    acc[3] = share

    def metrics(self) -> dict[str, float]:
        total = sum(a[1] for a in self.by_task.values())
        if not total:
            return {}
        out = {"allowed_mass_mean": sum(a[0] for a in self.by_task.values()) / total,
               "allowed_mass_min": min(a[2] for a in self.by_task.values())}
        for tag, (s, n, _, share) in sorted(self.by_task.items()):
            out[f"allowed_mass/{tag}"] = s / n
            if share == share:  # not NaN
                out[f"allowed_mass_uniform/{tag}"] = share
        return out
