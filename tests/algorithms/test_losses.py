"""Policy loss, log-probs, TIS and KL on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rollart_sdk.algorithms import (
    aggregate,
    kl_penalty,
    ppo_clip_loss,
    token_entropy,
    token_logprobs,
    truncated_is_weights,
)

# 2 sequences x 3 tokens; behaviour log-probs 0, so ratio = exp(logprobs) = RATIOS.
RATIOS = [[1.5, 0.9, 1.0], [0.5, 1.1, 2.0]]
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ADV = torch.tensor([1.0, -2.0])
# Per-token loss max(-A r, -A clip(r, 0.8, 1.2)), by hand:
#   seq 0 (A=+1): r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped);  r=0.9 -> -0.9;  (masked)
#   seq 1 (A=-2): r=0.5 -> max(1.0, 1.6) = 1.6 (clipped);  r=1.1 -> 2.2;
#                 r=2.0 -> max(4.0, 2.4) = 4.0 (a negative advantage is not clipped above)
TOKEN_LOSS = [[-1.2, -0.9], [1.6, 2.2, 4.0]]


def _logprobs() -> torch.Tensor:
    return torch.tensor(RATIOS).log().requires_grad_(True)


def test_ppo_clip_token_mean_matches_hand_computation() -> None:
    lp = _logprobs()
    loss, stats = ppo_clip_loss(lp, torch.zeros(2, 3), ADV, MASK, 0.2, 0.2, "token-mean")
    assert loss.item() == pytest.approx((-1.2 - 0.9 + 1.6 + 2.2 + 4.0) / 5)  # 1.14
    assert stats["clip_frac"].item() == pytest.approx(2 / 5)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 0.9 + 0.5 + 1.1 + 2.0) / 5)
    assert stats["ratio_max"].item() == pytest.approx(2.0)  # the masked 1.0 is ignored
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.9, 0.5, 1.1, 2.0)) / 5
    assert stats["approx_kl"].item() == pytest.approx(k3)
    assert stats["tokens"].item() == 5
    # Gradients: clipped and masked tokens get none; d(-A r)/d logp = -A r, over 5 tokens.
    loss.backward()
    expected = [[0.0, -0.9 / 5, 0.0], [0.0, 2.2 / 5, 4.0 / 5]]
    assert lp.grad.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]


def test_ppo_clip_seq_mean_and_clip_higher() -> None:
    loss, _ = ppo_clip_loss(_logprobs(), torch.zeros(2, 3), ADV, MASK, 0.2, None, "seq-mean")
    assert loss.item() == pytest.approx(((-1.2 - 0.9) / 2 + (1.6 + 2.2 + 4.0) / 3) / 2)
    # clip-higher: eps_high=0.6 lets r=1.5 through with A>0 -> -1.5 instead of -1.2
    loss, stats = ppo_clip_loss(_logprobs(), torch.zeros(2, 3), ADV, MASK, 0.2, 0.6)
    assert loss.item() == pytest.approx((-1.5 - 0.9 + 1.6 + 2.2 + 4.0) / 5)
    assert stats["clip_frac"].item() == pytest.approx(1 / 5)


def test_ppo_is_weights_scale_each_token() -> None:
    w = torch.tensor([[2.0, 1.0, 7.0], [1.0, 1.0, 0.5]])
    loss, _ = ppo_clip_loss(_logprobs(), torch.zeros(2, 3), ADV, MASK, 0.2, is_weights=w)
    assert loss.item() == pytest.approx((-2.4 - 0.9 + 1.6 + 2.2 + 2.0) / 5)


def test_ppo_per_token_advantages_and_nonzero_behaviour() -> None:
    # Same ratios expressed with a non-zero behaviour policy and [B, T] advantages.
    beh = torch.full((2, 3), -1.3)
    lp = (torch.tensor(RATIOS).log() - 1.3).requires_grad_(True)
    adv = ADV.unsqueeze(-1).expand(2, 3)
    loss, _ = ppo_clip_loss(lp, beh, adv, MASK, 0.2)
    assert loss.item() == pytest.approx(1.14, abs=1e-6)


def test_aggregate_with_global_normalizer_sums_over_micro_batches() -> None:
    torch.manual_seed(0)
    loss = torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).long()
    mask[:, 0] = 1
    for agg, denom in (("token-mean", mask.sum()), ("seq-mean", torch.tensor(4.0))):
        full = aggregate(loss, mask, agg)
        parts = aggregate(loss[:3], mask[:3], agg, denom) + aggregate(loss[3:], mask[3:], agg, denom)
        assert parts.item() == pytest.approx(full.item(), abs=1e-6)
    with pytest.raises(ValueError, match="token-mean, seq-mean"):
        aggregate(loss, mask, "sum")  # type: ignore[arg-type]


def test_token_logprobs_shifted_gather() -> None:
    # position 0 predicts token 1: p = softmax([0, ln 3]) = [1/4, 3/4]; position 1: [1/2, 1/2]
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0], [5.0, -5.0]]])
    ids = torch.tensor([[0, 1, 0]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 2)
    assert lp[0].tolist() == pytest.approx([math.log(0.75), math.log(0.5)])
    ent = token_entropy(logits)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert ent[0].tolist() == pytest.approx([h, math.log(2.0)])
    torch.manual_seed(1)
    logits = torch.randn(2, 6, 11)
    ids = torch.randint(0, 11, (2, 6))
    ref = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, ids), ref, atol=1e-6)
    with pytest.raises(ValueError, match="logits"):
        token_logprobs(logits, ids[:, :3])


def test_truncated_is_weights_cap_and_detach() -> None:
    lp = torch.tensor([0.5, 1.0, 3.0]).log().requires_grad_(True)
    w = truncated_is_weights(lp, torch.zeros(3), cap=2.0)
    assert w.tolist() == pytest.approx([0.5, 1.0, 2.0])
    assert not w.requires_grad
    with pytest.raises(ValueError, match="positive"):
        truncated_is_weights(lp, torch.zeros(3), cap=0.0)


def test_kl_estimators() -> None:
    lp = torch.tensor([math.log(0.5)], requires_grad=True)
    ref = torch.tensor([math.log(0.25)])
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(math.log(2.0))
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * math.log(2.0) ** 2)
    # k3 = ref/pi - log(ref/pi) - 1 = 0.5 + ln 2 - 1
    k3 = kl_penalty(lp, ref, "k3")
    assert k3.item() == pytest.approx(0.5 + math.log(2.0) - 1.0)
    k3.sum().backward()
    assert lp.grad.item() == pytest.approx(1.0 - 0.5)  # d/dlp (e^{ref-lp} + lp) = 1 - e^{ref-lp}
    assert kl_penalty(ref, ref, "k3").item() == 0.0
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_penalty(lp, ref, "k4")  # type: ignore[arg-type]


def test_decoupled_anchor_fresh_at_behaviour_stale_at_proximal_with_capped_weight():
    import math

    from rollart_sdk.algorithms import decoupled_anchor

    logp = torch.tensor([[-1.0, -1.0, -0.5]], requires_grad=True)
    beh = torch.tensor([[-1.2, -2.0, -3.0]])
    stale = torch.tensor([[False, True, True]])
    mask = torch.tensor([[1, 1, 0]])
    old, w, ratio = decoupled_anchor(logp, beh, stale, mask, tis_cap=2.0)
    # token 0 fresh: anchored at its behaviour log-prob, weight 1; token 1 stale: anchored
    # at the current log-prob, weight min(e^1, 2) = 2; token 2 is not trained (mask 0).
    assert old[0].tolist() == pytest.approx([-1.2, -1.0, -3.0])
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 1.0])
    assert ratio[0].tolist() == pytest.approx([math.exp(0.2), math.e, 0.0])
    assert not old.requires_grad and not w.requires_grad
    # tis_on_fresh: every trained token is corrected, the fresh one by min(e^0.2, 2).
    old, w, _ = decoupled_anchor(logp, beh, stale, mask, tis_cap=2.0, tis_on_fresh=True)
    assert old[0].tolist() == pytest.approx([-1.0, -1.0, -3.0])
    assert w[0].tolist() == pytest.approx([math.exp(0.2), 2.0, 1.0])
