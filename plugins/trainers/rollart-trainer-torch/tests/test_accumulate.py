"""``accumulate``: a step added up from parts (whole groups, as the pipeline sends them
when ``train.stream_groups`` is on) is the one-call step on their union."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from rollart_trainer_torch.trainer import TorchTrainer
from trainer_torch_helpers import make_batch, make_tiny_checkpoint, make_trainer

from rollart_sdk.types import TrainSample

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def _trainer(path: Path, **options: object) -> TorchTrainer:
    return make_trainer(path, **options)


def _groups(batch: list[TrainSample]) -> list[list[TrainSample]]:
    out: dict[str, list[TrainSample]] = {}
    for s in batch:
        out.setdefault(s.group_id, []).append(s)
    return list(out.values())


def _weights(t: TorchTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.model.state_dict().items()}


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean"])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_parts_add_up_to_the_one_call_step(ckpt: Path, loss_agg: str, seed: int) -> None:
    """A step once in one call and once as group parts (one group all equal: advantage
    0, not run, its tokens still counted): the same metrics and weights, and the weights
    moved. (From the same start each time: over several steps AdamW's update of a weight
    whose gradient nearly cancels turns rounding into visible differences.)"""
    b = make_batch(ckpt, n_groups=4, group_size=3, seed=seed)
    for s in b:  # group g1: every reward equal (advantage 0)
        if s.group_id == "g1":
            s.reward = 0.5
    one = _trainer(ckpt, loss_agg=loss_agg, grad_clip=0.5)
    parts = _trainer(ckpt, loss_agg=loss_agg, grad_clip=0.5)
    start = _weights(one)
    m1 = one.train_step(copy.deepcopy(b))
    g = _groups(copy.deepcopy(b))
    for group in g[:-1]:
        parts.accumulate(group)
    mp = parts.train_step(g[-1])
    assert (m1["parts"], mp["parts"]) == (1.0, 4.0)
    for key in ("loss", "pg_loss", "grad_norm", "tokens", "sequences", "forward_sequences",
                "batch_tokens", "reward_mean", "advantage_abs_mean", "clip_frac",
                "entropy", "version"):
        assert mp[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
    assert m1["forward_sequences"] == 9.0  # g1 not run
    w1, wp = _weights(one), _weights(parts)
    for k in w1:
        assert torch.allclose(w1[k], wp[k], atol=2e-5), (k, float((w1[k] - wp[k]).abs().max()))
    assert any(not torch.equal(start[k], w1[k]) for k in start)


def test_a_step_of_parts_then_a_plain_step(ckpt: Path) -> None:
    """The parts end with their train_step: the next step starts from nothing (no
    gradient or count carried over)."""
    a, b = (make_batch(ckpt, n_groups=2, seed=s) for s in (21, 22))
    one, parts = _trainer(ckpt), _trainer(ckpt)
    one.train_step(copy.deepcopy(a))
    ga = _groups(copy.deepcopy(a))
    parts.accumulate(ga[0])
    parts.train_step(ga[1])
    m1, mp = one.train_step(copy.deepcopy(b)), parts.train_step(copy.deepcopy(b))
    assert mp["parts"] == 1.0 and mp["tokens"] == m1["tokens"]
    for k, v in _weights(one).items():
        assert torch.allclose(v, parts.model.state_dict()[k], atol=1e-6), k


def test_accumulate_refuses_what_it_cannot_add_up(ckpt: Path) -> None:
    t = _trainer(ckpt, updates_per_batch=2)
    assert not t.can_accumulate
    with pytest.raises(ValueError, match="updates_per_batch 1"):
        t.accumulate(make_batch(ckpt))
    assert _trainer(ckpt).can_accumulate


def test_a_checkpoint_load_drops_a_step_in_progress(ckpt: Path, tmp_path: Path) -> None:
    """Parts of a step the run stopped in (accumulated, never stepped) are not carried
    into the step after a load: the next train_step is the loaded trainer's own."""
    a, b = (make_batch(ckpt, n_groups=2, seed=s) for s in (31, 32))
    saver = _trainer(ckpt)
    saver.train_step(copy.deepcopy(a))
    saver.save_checkpoint(str(tmp_path / "ck"))
    stopped, fresh = _trainer(ckpt), _trainer(ckpt)
    stopped.accumulate(_groups(copy.deepcopy(b))[0])  # a stop landed after this part
    stopped.load_checkpoint(str(tmp_path / "ck"))
    fresh.load_checkpoint(str(tmp_path / "ck"))
    ms, mf = stopped.train_step(copy.deepcopy(b)), fresh.train_step(copy.deepcopy(b))
    assert ms["parts"] == mf["parts"] == 1.0 and ms["tokens"] == mf["tokens"]
    for k, v in fresh.model.state_dict().items():
        assert torch.equal(v, stopped.model.state_dict()[k]), k
