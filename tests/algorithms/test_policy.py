"""The sampled policy (rollart_sdk.algorithms.policy): what engines report and trainers
recompute, checked against a dense softmax written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rollart_sdk.algorithms import (
    MismatchMeter,
    allowed_groups,
    policy_logprob,
    policy_scores,
    policy_temperature,
    policy_token_logprobs,
)


def _dense(row: torch.Tensor, token: int, t: float, allowed: list[int] | None) -> float:
    """log softmax(mask(row) / t)[token], one term at a time."""
    ids = allowed if allowed is not None else list(range(row.numel()))
    z = sum(math.exp(float(row[i]) / t) for i in ids)
    return float(row[token]) / t - math.log(z)


def test_rows_with_their_own_temperature_and_mask() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 10, generator=g, dtype=torch.float64).float()
    targets = torch.tensor([1, 3, 5, 3, 7, 2])
    temps = [1.0, 0.7, 0.7, 1.3, 0.5, 1.0]
    sets = [None, [3, 5, 7], [3, 5, 7], [2, 3], None, [2, 9]]
    groups, allowed = allowed_groups(sets)
    assert groups == [-1, 0, 0, 1, -1, 2] and [a.tolist() for a in allowed] == [
        [3, 5, 7], [2, 3], [2, 9]]
    lp, ent = policy_token_logprobs(logits, targets, torch.tensor(temps),
                                    torch.tensor(groups), allowed, entropy=True)
    want = [_dense(logits[i], int(targets[i]), temps[i], sets[i]) for i in range(6)]
    assert lp.tolist() == pytest.approx(want, abs=1e-5)
    # the entropy of each row's own policy
    dense_ent = 0.0
    for i in range(6):
        p = torch.softmax(policy_scores(logits[i], temps[i],
                                        None if sets[i] is None else torch.tensor(sets[i])), -1)
        dense_ent += float(-(p[p > 0] * p[p > 0].log()).sum())
    assert ent == pytest.approx(dense_ent, abs=1e-4)
    # ... and a masked row is not the raw distribution (what trainers computed before)
    raw = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert float((lp - raw)[1:4].abs().min()) > 0.1


def test_allowed_mass_against_a_hand_computation() -> None:
    # Row 0: logits [2, 0, 0, ln 2] at T = 1 constrained to {1, 3}: the unmasked
    # softmax is [e^2, 1, 1, 2] / (e^2 + 4); the allowed mass (1 + 2) / (e^2 + 4).
    # Row 1: the same at T = 0.5: [e^4, 1, 1, 4] / (e^4 + 6); mass 5 / (e^4 + 6).
    # Row 2: unconstrained: NaN.
    row = [2.0, 0.0, 0.0, math.log(2.0)]
    logits = torch.tensor([row, row, row])
    lp, _, log_mass = policy_token_logprobs(
        logits, torch.tensor([3, 3, 0]), torch.tensor([1.0, 0.5, 1.0]),
        torch.tensor([0, 0, -1]), [torch.tensor([1, 3])], allowed_mass=True)
    assert float(log_mass[0].exp()) == pytest.approx(3 / (math.e ** 2 + 4), rel=1e-6)
    assert float(log_mass[1].exp()) == pytest.approx(5 / (math.e ** 4 + 6), rel=1e-6)
    assert math.isnan(float(log_mass[2])) and not log_mass.requires_grad
    # the masked log-probs are unchanged by asking for it: log(2 / 3), log(4 / 5)
    assert lp[:2].tolist() == pytest.approx([math.log(2 / 3), math.log(4 / 5)], abs=1e-6)
    # no constrained row at all: every value NaN
    _, _, none = policy_token_logprobs(logits, torch.tensor([0, 1, 2]), allowed_mass=True)
    assert all(math.isnan(v) for v in none.tolist())


def test_the_engine_side_agrees_and_gradients_flow() -> None:
    logits = torch.randn(2, 8, requires_grad=True)
    allowed = torch.tensor([0, 4, 6])
    lp, _ = policy_token_logprobs(logits, torch.tensor([4, 6]), torch.tensor([0.7, 0.7]),
                                  torch.tensor([0, 0]), [allowed])
    for i, tok in enumerate((4, 6)):
        assert float(lp[i]) == pytest.approx(policy_logprob(logits[i].detach(), tok, 0.7,
                                                            allowed), abs=1e-6)
    lp.sum().backward()
    assert logits.grad is not None
    # ids outside the allowed set get no gradient: the policy does not depend on them
    outside = [i for i in range(8) if i not in (0, 4, 6)]
    assert float(logits.grad[:, outside].abs().max()) == 0.0


def test_greedy_is_temperature_one() -> None:
    assert policy_temperature(0.0) == 1.0 and policy_temperature(0.5) == 0.5
    row = torch.randn(5)
    assert policy_logprob(row, 2, 0.0) == pytest.approx(float(torch.log_softmax(row, -1)[2]))


def test_mismatch_meter_counts_fresh_tokens_per_engine() -> None:
    m = MismatchMeter()
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    engine = torch.tensor([[-1.0, -2.5, -9.0], [-1.2, -1.0, -1.0]])
    fresh = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # [0, 2] is stale: not counted
    m.add(trainer, engine, fresh, ["vllm-0", "torch-0"])
    out = m.metrics()
    assert out["mismatch_tokens"] == 5.0
    assert out["mismatch_mean"] == pytest.approx((0.5 + 0.2) / 5)
    assert out["mismatch_max"] == pytest.approx(0.5)
    assert out["train/mismatch_max/vllm-0"] == pytest.approx(0.5)
    assert out["train/mismatch_mean/torch-0"] == pytest.approx(0.2 / 3)
    other = MismatchMeter()
    other.merge([m.by_engine, {"vllm-0": [1.0, 1.0, 1.0]}])
    assert other.metrics()["mismatch_max"] == 1.0
    assert math.isnan(MismatchMeter().metrics()["mismatch_mean"])
