"""The stale-token anchor of the shared objective (rollart_sdk.backends.objective), on a
constructed off-policy batch: two stale tokens, both with advantage +1, sampled by an
older version that gave them probability 0.4; the weights being trained (the proximal
policy, one update per batch) already give token 0 probability 0.6 (moved 1.5x since it
was sampled, past 1 + clip_eps) and token 1 probability 0.44 (1.1x, inside the range).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rollart_sdk.backends.objective import decoupled_ppo_objective
from rollart_sdk.backends.trainer_options import TrainerOptionsBase


def _opts(anchor: str) -> SimpleNamespace:
    return SimpleNamespace(clip_eps=0.2, clip_eps_high=None, tis_cap=2.0,
                           tis_on_fresh=False, kl_coef=0.0, kl_kind="k3",
                           stale_anchor=anchor)


def _grad(anchor: str) -> tuple[torch.Tensor, object]:
    logp = torch.tensor([[math.log(0.6), math.log(0.44)]], requires_grad=True)
    behaviour = torch.full((1, 2), math.log(0.4))
    obj = decoupled_ppo_objective(
        logp, behaviour, advantages=torch.tensor([1.0]), mask=torch.ones(1, 2),
        versions=torch.zeros(1, 2, dtype=torch.long), version=2, opts=_opts(anchor),
        normalizer=2.0)
    obj.loss.backward()
    assert logp.grad is not None
    return logp.grad[0], obj


def test_behaviour_anchor_stops_pushing_a_stale_token_already_past_the_clip_range():
    grad, obj = _grad("behaviour")
    # d loss / d logp = -A * r / normalizer where the ratio pi / mu is inside 1 +- 0.2,
    # 0 where the updates since sampling already took it past 1.2 (token 0: r = 1.5).
    assert grad.tolist() == pytest.approx([0.0, -1.1 / 2])
    assert obj.clip["clip_frac"].item() == pytest.approx(0.5)
    assert obj.old[0].tolist() == pytest.approx([math.log(0.4)] * 2)
    assert obj.weights[0].tolist() == [1.0, 1.0]


def test_proximal_anchor_keeps_pushing_it_with_its_importance_weight():
    """AReaL's decoupled PPO with one update per batch: the ratio to the proximal policy
    is 1, its clip never binds, and token 0 gets the full weighted push min(1.5, 2)."""
    grad, obj = _grad("proximal")
    assert grad.tolist() == pytest.approx([-1.5 / 2, -1.1 / 2])
    assert obj.clip["clip_frac"].item() == 0.0
    assert obj.weights[0].tolist() == pytest.approx([1.5, 1.1])


def test_the_anchors_agree_on_fresh_tokens():
    """A fresh token (its version is the trainer's) is anchored at its behaviour log-prob
    either way: a synchronous run computes the same update whatever stale_anchor says."""
    logp = torch.tensor([[math.log(0.6), math.log(0.44)]], requires_grad=True)
    behaviour = torch.full((1, 2), math.log(0.4))
    grads = []
    for anchor in ("behaviour", "proximal"):
        logp.grad = None
        obj = decoupled_ppo_objective(
            logp, behaviour, advantages=torch.tensor([1.0]), mask=torch.ones(1, 2),
            versions=torch.full((1, 2), 2), version=2, opts=_opts(anchor), normalizer=2.0)
        obj.loss.backward()
        assert logp.grad is not None
        grads.append(logp.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_default_and_bad_value():
    assert TrainerOptionsBase().stale_anchor == "behaviour"
    with pytest.raises(ValueError, match="proximal or behaviour"):
        _grad("prox")


def test_the_reported_importance_weight_is_over_the_tokens_it_weights():
    """``tis_weight_mean`` is the mean weight of the tokens it corrects: the stale ones,
    and with ``tis_on_fresh`` (proximal anchor) every trained token. A synchronous run with
    tis_on_fresh (nothing stale; the engine's numerics differ from the trainer's) weights
    each token by min(pi / mu, cap) and reports that mean, not 0."""
    from rollart_sdk.backends.objective import LossStats

    logp = torch.tensor([[math.log(0.6), math.log(0.44), math.log(0.1)]])
    behaviour = torch.tensor([[math.log(0.4), math.log(0.4), math.log(0.4)]])
    fresh = torch.full((1, 3), 2)
    opts = _opts("proximal")
    opts.tis_on_fresh = True
    obj = decoupled_ppo_objective(logp, behaviour, advantages=torch.tensor([1.0]),
                                  mask=torch.ones(1, 3), versions=fresh, version=2, opts=opts,
                                  normalizer=3.0)
    stats = LossStats()
    stats.add(obj, entropy=0.0)
    m = stats.metrics(compute_entropy=False)
    assert m["stale_frac"] == 0.0
    assert obj.weights[0].tolist() == pytest.approx([1.5, 1.1, 0.25])
    assert m["tis_weight_mean"] == pytest.approx((1.5 + 1.1 + 0.25) / 3)
    # Without tis_on_fresh nothing is weighted; one stale token of two: its weight alone.
    opts.tis_on_fresh = False
    obj = decoupled_ppo_objective(logp[:, :2], behaviour[:, :2], advantages=torch.tensor([1.0]),
                                  mask=torch.ones(1, 2), versions=torch.tensor([[1, 2]]),
                                  version=2, opts=opts, normalizer=2.0)
    stats = LossStats()
    stats.add(obj, entropy=0.0)
    assert stats.metrics(compute_entropy=False)["tis_weight_mean"] == pytest.approx(1.5)
