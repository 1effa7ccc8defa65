"""GRPO advantages on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rollart_sdk.algorithms import fill_advantages, grpo_advantages
from rollart_sdk.types import TrainSample

REWARDS = [1.0, 0.0, 0.5, 0.5, 2.0, 1.0, 0.0, 3.0]
GROUPS = ["a", "a", "b", "b", "c", "c", "c", "d"]


def test_grpo_normalised_by_group_std() -> None:
    adv = grpo_advantages(torch.tensor(REWARDS), GROUPS, eps=0.0)
    # a: mean 0.5, sample std sqrt(0.5) -> +-0.5/sqrt(0.5); b: equal rewards -> 0;
    # c: mean 1, std 1 -> 1, 0, -1; d: a group of one -> 0.
    s = 0.5 / math.sqrt(0.5)
    expected = [s, -s, 0.0, 0.0, 1.0, 0.0, -1.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_grpo_eps_enters_the_denominator() -> None:
    adv = grpo_advantages(torch.tensor([2.0, 1.0, 0.0]), [0, 0, 0], eps=1.0)
    assert adv.tolist() == pytest.approx([0.5, 0.0, -0.5])


def test_grpo_without_std_is_centred_reward() -> None:
    adv = grpo_advantages(torch.tensor(REWARDS), GROUPS, normalize_std=False)
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 1.0, 0.0, -1.0, 0.0])


def test_equal_rewards_give_exact_zero_even_with_rounding() -> None:
    # (0.1 + 0.1 + 0.1) / 3 != 0.1 in floating point: without the special case the
    # tiny residual divided by a tiny eps would be a large, random advantage.
    adv = grpo_advantages(torch.tensor([0.1, 0.1, 0.1]), ["g"] * 3, eps=1e-12)
    assert adv.tolist() == [0.0, 0.0, 0.0]
    assert not torch.isnan(grpo_advantages(torch.tensor([1.0]), ["x"])).any()


def test_group_ids_as_int_tensor_and_dtype_kept() -> None:
    adv = grpo_advantages(
        torch.tensor([1.0, 3.0, 5.0, 5.0], dtype=torch.float64), torch.tensor([7, 7, 9, 9])
    )
    assert adv.dtype == torch.float64
    assert adv.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0], abs=1e-5)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 rewards but 2 group ids"):
        grpo_advantages(torch.zeros(3), ["a", "b"])


def _sample(reward: float, group: str, adv: float | None = None) -> TrainSample:
    return TrainSample([1, 2], [0, 1], [0.0, -1.0], [-1, 0], reward, group, advantage=adv)


def test_fill_advantages_fills_only_missing_over_whole_batch() -> None:
    batch = [_sample(1.0, "a"), _sample(0.0, "a", adv=5.0), _sample(2.0, "b"), _sample(0.0, "b")]
    out = fill_advantages(batch, eps=0.0)
    assert out is batch
    s = 0.5 / math.sqrt(0.5)
    assert batch[0].advantage == pytest.approx(s)  # group a still uses both rewards
    assert batch[1].advantage == 5.0  # kept
    assert batch[2].advantage == pytest.approx(1.0 / math.sqrt(2.0))
    assert batch[3].advantage == pytest.approx(-1.0 / math.sqrt(2.0))


def test_a_trajectory_of_several_segments_is_one_group_member() -> None:
    """An agent episode trained as several samples (segments) counts once in its group's
    statistics; its other segments take its advantage."""
    def sample(r: float, g: str, tid: str, seg: int = 0) -> TrainSample:
        return TrainSample([1], [1], [0.0], [0], reward=r, group_id=g, trajectory_id=tid,
                           segment=seg)

    plain = [sample(1.0, "a", "t0"), sample(0.0, "a", "t1"), sample(0.0, "a", "t2")]
    fill_advantages(plain)
    batch = [sample(1.0, "a", "t0"), sample(1.0, "a", "t0", 1), sample(1.0, "a", "t0", 2),
             sample(0.0, "a", "t1"), sample(0.0, "a", "t2"), sample(0.0, "a", "t2", 1)]
    fill_advantages(batch)
    a0, a1, a2 = (s.advantage for s in plain)
    assert [s.advantage for s in batch] == pytest.approx([a0, a0, a0, a1, a2, a2])
    assert a0 == pytest.approx(2 / math.sqrt(3), rel=1e-5)  # mean 1/3, std 1/sqrt(3)
    with pytest.raises(ValueError, match="without its segment 0"):
        fill_advantages([sample(1.0, "a", "t0"), sample(0.0, "a", "t9", 1)])


def _across(rank: int, init: str, out: str) -> None:
    import json

    import torch.distributed as dist

    from rollart_sdk.backends.distributed import fill_advantages_across

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        def sample(r: float, tid: str, seg: int = 0) -> TrainSample:
            return TrainSample([1], [1], [0.0], [0], reward=r, group_id="a", trajectory_id=tid,
                               segment=seg)

        # Rank 1 holds t0's earlier segment, rank 0 its segment 0.
        mine = ([sample(1.0, "t0"), sample(0.0, "t1")] if rank == 0
                else [sample(1.0, "t0", 1), sample(0.0, "t2")])
        fill_advantages_across(mine, 1e-6, True, torch.device("cpu"), size=2, rank=rank)
        with open(f"{out}.{rank}", "w") as f:
            json.dump([s.advantage for s in mine], f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_segments_split_over_data_parallel_ranks_take_their_trajectorys_advantage(
        tmp_path) -> None:
    import json

    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'store'}"
    mp.spawn(_across, args=(init, str(tmp_path / "adv")), nprocs=2, join=True)
    r0 = json.loads((tmp_path / "adv.0").read_text())
    r1 = json.loads((tmp_path / "adv.1").read_text())
    plain = [TrainSample([1], [1], [0.0], [0], reward=r, group_id="a") for r in (1.0, 0.0, 0.0)]
    a0, a1, a2 = (s.advantage for s in fill_advantages(plain))
    assert r0 == pytest.approx([a0, a1]) and r1 == pytest.approx([a0, a2])
