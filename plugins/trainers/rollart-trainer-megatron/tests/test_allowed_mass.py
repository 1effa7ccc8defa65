"""Trainer ``megatron``'s allowed-mass sums (schedule._policy_logprobs) against a dense
softmax: no megatron-core needed, the function works on packed logits."""

from __future__ import annotations

import pytest
import torch
from rollart_trainer_megatron.schedule import METRIC_MAXES, METRIC_SUMS, _policy_logprobs


def test_allowed_mass_sums_and_minimum() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 10, generator=g)
    # row 0: a constrained sample trained at tokens 1 and 2 (logits at positions 0 and 1);
    # row 1: an unconstrained one, which adds nothing
    t = {"loss_mask": torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 0]]),
         "ids": torch.tensor([[5, 1, 2, 0, 0], [4, 4, 7, 8, 0]]),
         "temperature": torch.full((2, 5), 0.7),
         "group": torch.tensor([[0] * 5, [-1] * 5]),
         "allowed": [torch.tensor([1, 2, 3])]}
    state = {"sums": dict.fromkeys(METRIC_SUMS, 0.0), "maxes": dict.fromkeys(METRIC_MAXES, 0.0)}
    _policy_logprobs(logits, t, False, state)
    want = [float(torch.softmax(logits[0, c] / 0.7, -1)[[1, 2, 3]].sum()) for c in (0, 1)]
    assert state["sums"]["allowed_rows"] == 2.0
    assert state["sums"]["allowed_mass"] == pytest.approx(sum(want), abs=1e-6)
    assert 1.0 - state["maxes"]["allowed_gap"] == pytest.approx(min(want), abs=1e-6)
