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


def test_rloo_baseline_is_the_mean_of_the_other_members() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0])
    g = ["a"] * 4 + ["b"] * 2 + ["c"] * 2
    adv = grpo_advantages(r, g, estimator="rloo").tolist()
    for i, (ri, gi) in enumerate(zip(r.tolist(), g, strict=True)):
        others = [rj for j, (rj, gj) in enumerate(zip(r.tolist(), g, strict=True))
                  if gj == gi and j != i]
        expect = 0.0 if gi == "c" else ri - sum(others) / len(others)  # "c": equal rewards
        assert adv[i] == pytest.approx(expect, abs=1e-6)  # float32 rewards in, float32 out
    assert grpo_advantages(torch.tensor([5.0]), ["solo"], estimator="rloo").tolist() == [0.0]


def _verl_masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl.utils.torch_functional.masked_whiten (shift_mean=True, unbiased variance),
    written out here as verl has it, for the comparison below."""
    mean = (values * mask).sum() / mask.sum()
    centred = values - mean
    var = (centred**2 * mask).sum() / mask.sum()
    var = var * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def test_reinforce_pp_baseline_is_verls_token_whitened_group_baseline() -> None:
    """Group mean subtracted per trajectory, then whitened over every trained token of the
    batch, as verl's compute_reinforce_plus_plus_baseline_outcome_advantage does on its
    [batch, response length] scores and mask."""
    rewards = [1.0, 0.0, 0.0, 2.0, 1.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "c"]
    lengths = [3, 5, 2, 4, 1, 6]
    # verl's layout: one row per trajectory, its reward on each of its response tokens.
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths], dtype=torch.float64)
    means = {g: sum(r for r, h in zip(rewards, groups, strict=True) if h == g)
             / groups.count(g) for g in set(groups)}
    scores = torch.tensor([r - means[g] for r, g in zip(rewards, groups, strict=True)],
                          dtype=torch.float64)
    verl = _verl_masked_whiten(scores.unsqueeze(-1) * mask, mask)[:, 0]
    ours = grpo_advantages(torch.tensor(rewards, dtype=torch.float64), groups,
                           estimator="reinforce_pp_baseline", tokens=lengths)
    assert ours.tolist() == pytest.approx(verl.tolist(), abs=1e-9)
    # Weighted by the trained tokens: a batch mean of 0 and variance of 1 over tokens.
    w = torch.tensor(lengths, dtype=torch.float64)
    assert float((w * ours).sum()) == pytest.approx(0.0, abs=1e-9)
    assert float((w * ours**2).sum() / (w.sum() - 1)) == pytest.approx(1.0, rel=1e-6)


def test_fill_advantages_counts_a_trajectorys_tokens_over_its_segments() -> None:
    """reinforce_pp_baseline weighs a trajectory by all its trained tokens: an agent
    episode's earlier segment adds to its segment 0's weight (and takes its advantage)."""
    def sample(r: float, tid: str, trained: int, seg: int = 0, group: str = "a") -> TrainSample:
        return TrainSample([1] * trained, [1] * trained, [0.0] * trained, [0] * trained,
                           reward=r, group_id=group, trajectory_id=tid, segment=seg)

    batch = [sample(1.0, "t0", 2), sample(0.0, "t1", 3), sample(1.0, "t0", 4, seg=1),
             sample(0.5, "t2", 1, group="b"), sample(1.5, "t3", 1, group="b")]
    fill_advantages(batch, estimator="reinforce_pp_baseline")
    expect = grpo_advantages(torch.tensor([1.0, 0.0, 0.5, 1.5]), ["a", "a", "b", "b"],
                             estimator="reinforce_pp_baseline", tokens=[6, 3, 1, 1])
    assert [batch[i].advantage for i in (0, 1, 3, 4)] == pytest.approx(expect.tolist())
    assert batch[2].advantage == batch[0].advantage
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        grpo_advantages(torch.tensor([1.0]), ["a"], estimator="ppo")  # type: ignore[arg-type]


def _across_whitened(rank: int, init: str, out: str) -> None:
    import json

    import torch.distributed as dist

    from rollart_sdk.backends.distributed import fill_advantages_across

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        def sample(r: float, tid: str, n: int, seg: int = 0) -> TrainSample:
            return TrainSample([1] * n, [1] * n, [0.0] * n, [0] * n, reward=r, group_id="a",
                               trajectory_id=tid, segment=seg)

        mine = ([sample(1.0, "t0", 2), sample(0.0, "t1", 5)] if rank == 0
                else [sample(1.0, "t0", 3, 1), sample(0.5, "t2", 1)])
        fill_advantages_across(mine, 1e-6, True, torch.device("cpu"), size=2, rank=rank,
                               estimator="reinforce_pp_baseline")
        with open(f"{out}.{rank}", "w") as f:
            json.dump([s.advantage for s in mine], f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_batch_whitening_over_data_parallel_ranks_sees_every_ranks_tokens(tmp_path) -> None:
    """reinforce_pp_baseline on two ranks: the same advantages as on one (the token counts
    travel with the rewards; t0's earlier segment on rank 1 adds to its weight)."""
    import json

    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'store'}"
    mp.spawn(_across_whitened, args=(init, str(tmp_path / "adv")), nprocs=2, join=True)
    r0 = json.loads((tmp_path / "adv.0").read_text())
    r1 = json.loads((tmp_path / "adv.1").read_text())
    a0, a1, a2 = grpo_advantages(torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64),
                                 ["a"] * 3, estimator="reinforce_pp_baseline",
                                 tokens=[5, 5, 1]).tolist()
    assert r0 == pytest.approx([a0, a1]) and r1 == pytest.approx([a0, a2])


def test_a_grpo_only_option_with_another_estimator_is_an_error() -> None:
    from rollart_sdk.backends.trainer_options import TrainerOptionsBase

    with pytest.raises(ValueError, match="adv_normalize_std: false is GRPO's switch"):
        TrainerOptionsBase(adv_estimator="rloo", adv_normalize_std=False)
    assert TrainerOptionsBase(adv_estimator="rloo").adv_estimator == "rloo"
    assert not TrainerOptionsBase(adv_normalize_std=False).adv_normalize_std
