"""The shared next-token draw (``rollart_sdk.algorithms.draw``): its frequencies against
distributions worked out by hand (temperature, top-k, top-p, and all three), for the
float32 logits of the torch engine and the float64 log-probs of the SGLang adapter;
greedy at temperature 0; the top-k / top-p masks on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rollart_sdk.algorithms import draw, filter_scores
from rollart_sdk.types import SamplingParams

INF = float("-inf")


# probabilities 0.1, 0.2, 0.3, 0.4 at temperature 1 (scores are their logs)
FOUR = torch.tensor([math.log(p) for p in (0.1, 0.2, 0.3, 0.4)])
CASES = [  # params -> the distribution worked out by hand
    (SamplingParams(temperature=1.0), [0.1, 0.2, 0.3, 0.4]),
    # T = 0.5 squares the probabilities: 0.01, 0.04, 0.09, 0.16 over 0.30
    (SamplingParams(temperature=0.5), [1 / 30, 4 / 30, 9 / 30, 16 / 30]),
    (SamplingParams(temperature=1.0, top_k=2), [0, 0, 3 / 7, 4 / 7]),
    # top-p 0.6: 0.4 < 0.6 so 0.3 joins; 0.7 >= 0.6 so 0.2 does not
    (SamplingParams(temperature=1.0, top_p=0.6), [0, 0, 3 / 7, 4 / 7]),
    (SamplingParams(temperature=1.0, top_p=0.35), [0, 0, 0, 1]),
    # T = 0.5 first (0.033, 0.133, 0.3, 0.533), then top-k 3 and top-p 0.8: 0.533 + 0.3
    # reaches 0.8, so {2, 3} remain, in the ratio 9 : 16
    (SamplingParams(temperature=0.5, top_k=3, top_p=0.8), [0, 0, 9 / 25, 16 / 25]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("params", "want"), CASES,
                         ids=lambda x: f"t{x.temperature}k{x.top_k}p{x.top_p}"
                         if isinstance(x, SamplingParams) else "")
def test_draw_frequencies_match_the_hand_computed_distribution(
        params: SamplingParams, want: list[float], dtype: torch.dtype) -> None:
    # float32: the torch engine's logits; float64: the SGLang adapter's allowed log-probs
    # (log-probs differ from logits by one constant: the same draw).
    gen = torch.Generator().manual_seed(123)
    n = 6000
    counts = [0] * 4
    for _ in range(n):
        counts[draw(FOUR.to(dtype) + 2.5, params, gen)] += 1
    for i, p in enumerate(want):
        if p == 0:
            assert counts[i] == 0, (params, counts)
        else:  # 4.5 standard deviations of a binomial frequency, at most
            assert counts[i] / n == pytest.approx(p, abs=4.5 * math.sqrt(p * (1 - p) / n) + 1e-9)
    # the same generator state gives the same ids: the draw is a function of it
    a, b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert ([draw(FOUR, params, a) for _ in range(50)]
            == [draw(FOUR.double(), params, b) for _ in range(50)])


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
