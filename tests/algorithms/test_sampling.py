"""The shared next-token draw (``rollart_sdk.algorithms.draw``): the same ids as the
draw the torch engine and the SGLang adapter each carried before it moved to the core,
for the same scores and generator state; greedy at temperature 0; the top-k / top-p
masks on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rollart_sdk.algorithms import draw, filter_scores
from rollart_sdk.types import SamplingParams

INF = float("-inf")


def _draw_before_the_move(x: torch.Tensor, params: SamplingParams,
                          generator: torch.Generator) -> int:
    """The draw as both engines wrote it before it moved to the core (frozen copy of
    rollart_engine_torch/sampling.py::choose_token after its mask; the SGLang adapter's
    choose_allowed was the same on float64): the reference the core must match."""
    if params.temperature <= 0:
        return int(torch.argmax(x))
    x = x / params.temperature
    if params.top_k and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(0, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=12, top_p=0.6),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"t{p.temperature}k{p.top_k}p{p.top_p}")
def test_draw_matches_the_engines_draw_before_the_move(params: SamplingParams,
                                                        dtype: torch.dtype) -> None:
    # float32: the torch engine's logits; float64: the SGLang adapter's allowed log-probs.
    logits = torch.randn(40, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    new, old = torch.Generator().manual_seed(123), torch.Generator().manual_seed(123)
    got = [draw(row, params, new) for row in logits for _ in range(5)]
    want = [_draw_before_the_move(row, params, old) for row in logits for _ in range(5)]
    assert got == want
    assert len(set(got)) > 5  # the rows really were sampled, not all argmaxed
    # and the generators end in the same state: the same number of draws were taken
    assert torch.equal(new.get_state(), old.get_state())


def test_temperature_zero_is_greedy_and_leaves_the_generator_alone() -> None:
    scores = torch.tensor([0.1, 2.5, -1.0, 2.4])
    gen = torch.Generator().manual_seed(7)
    before = gen.get_state()
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, top_k=1),
                   SamplingParams(temperature=-1.0, top_p=0.1)):
        assert draw(scores, params, gen) == 1
    assert torch.equal(gen.get_state(), before)
    # a masked (-inf) argmax candidate is never picked
    assert draw(torch.tensor([INF, 1.0, INF, 3.0]), SamplingParams(temperature=0.0), gen) == 3


def test_top_k_keeps_the_k_largest_after_the_temperature() -> None:
    scores = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    out = filter_scores(scores, SamplingParams(temperature=2.0, top_k=2))
    assert out.tolist() == [INF, 2.0, 1.5, INF, INF]
    # top_k >= vocabulary size (or 0) masks nothing
    assert filter_scores(scores, SamplingParams(top_k=5)).tolist() == scores.tolist()
    assert filter_scores(scores, SamplingParams(top_k=0)).tolist() == scores.tolist()


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05 (scores are their logs, out of order)
    probs = [0.15, 0.5, 0.05, 0.3]
    scores = torch.tensor([math.log(p) for p in probs], dtype=torch.float64)
    kept = lambda top_p: [i for i, v in enumerate(  # noqa: E731
        filter_scores(scores, SamplingParams(top_p=top_p)).tolist()) if v != INF]
    assert kept(0.5) == [1]            # 0.5 alone reaches 0.5
    assert kept(0.6) == [1, 3]         # 0.5 < 0.6 -> add 0.3
    assert kept(0.9) == [0, 1, 3]      # 0.8 < 0.9 -> add 0.15
    assert kept(0.99) == [0, 1, 2, 3]
    assert kept(1e-9) == [1]           # at least one id is kept
    # the draw never leaves the kept set
    gen = torch.Generator().manual_seed(1)
    assert {draw(scores, SamplingParams(top_p=0.6), gen) for _ in range(200)} == {1, 3}


def test_draw_follows_the_filtered_distribution() -> None:
    scores = torch.tensor([0.0, math.log(3.0), INF])  # p = 0.25, 0.75, 0
    gen = torch.Generator().manual_seed(5)
    counts = [0, 0, 0]
    for _ in range(4000):
        counts[draw(scores, SamplingParams(), gen)] += 1
    assert counts[2] == 0
    assert counts[1] / 4000 == pytest.approx(0.75, abs=0.03)


def test_filter_scores_refuses_temperature_zero() -> None:
    with pytest.raises(ValueError, match="temperature > 0"):
        filter_scores(torch.zeros(3), SamplingParams(temperature=0.0))
