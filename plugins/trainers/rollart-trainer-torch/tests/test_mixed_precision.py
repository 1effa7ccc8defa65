"""Trainer ``torch`` with a bfloat16 / float16 model: fp32 master weights, float16 loss
scaling, their checkpoints, data parallelism and exported weights (issue 30, item 4)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from _dp_worker import run_rank
from rollart_trainer_torch.trainer import TorchTrainer
from safetensors.torch import load_file
from trainer_torch_helpers import make_batch, make_tiny_checkpoint

from rollart_sdk.config import ModelConfig
from rollart_sdk.types import TrainSample

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def batch(ckpt: Path) -> list[TrainSample]:
    return make_batch(ckpt)


def _trainer(path: Path, dtype: str, **options: object) -> TorchTrainer:
    opts = {"lr": 1e-6, "micro_batch_size": 4, "seed": 0, "num_threads": 1, **options}
    return TorchTrainer(model=ModelConfig(path=str(path), dtype=dtype), **opts)  # type: ignore[arg-type]


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().float().reshape(-1) for t in tensors])


def test_bf16_at_rl_learning_rates_moves_only_with_master_weights(
        ckpt: Path, batch: list[TrainSample]) -> None:
    """lr 1e-6, three steps on one batch. With master weights (the bf16 default) the fp32
    masters take the float32 run's update: within 15 % (measured 8 %), cosine > 0.99
    (0.997); the difference is the bf16 forward's gradients. Without them, the bf16
    weights keep what AdamW gave them in the first step on the ~2 % of elements whose
    magnitude is small enough for a 1e-6 step to show (|w| < ~2.6e-4) and nothing else:
    98 % of the weights never move, and the update is a fifth of the float32 one."""
    ref, masters = _trainer(ckpt, "float32"), _trainer(ckpt, "bfloat16")
    plain = _trainer(ckpt, "bfloat16", master_weights=False)
    assert masters.optimizer.master_weights and not plain.optimizer.master_weights
    assert not ref.optimizer.master_weights  # auto: off for float32
    assert all(m.dtype == torch.float32 for m in masters.optimizer.main_params)
    assert all(p.dtype == torch.bfloat16 for p in masters.params)
    start32, start_m, start_p = (_flat(ref.params), _flat(masters.optimizer.main_params),
                                 _flat(plain.params))
    for _ in range(3):
        for t in (ref, masters, plain):
            assert not t.train_step(copy.deepcopy(batch))["skipped"]
    d32 = _flat(ref.params) - start32
    dm = _flat(masters.optimizer.main_params) - start_m
    dp = _flat(plain.params) - start_p
    assert float((dm - d32).norm() / d32.norm()) < 0.15
    assert float(dm @ d32 / (dm.norm() * d32.norm())) > 0.99
    assert float((dm != 0).float().mean()) > 0.9  # nearly every master moved
    assert float((dp == 0).float().mean()) > 0.97  # ... nearly no plain bf16 weight did
    assert float(dp.norm() / d32.norm()) < 0.3
    # AdamW's moments are fp32 with master weights, bf16 without.
    m0 = masters.optimizer.main_params[0]
    assert masters.optimizer.state[m0]["exp_avg"].dtype == torch.float32
    assert plain.optimizer.state[plain.params[0]]["exp_avg"].dtype == torch.bfloat16
    # The model holds the masters rounded to bf16 (stochastically, the default: to one of
    # the two bf16 values around each master), and exports exactly that.
    moved = []
    for p, m in zip(masters.params, masters.optimizer.main_params, strict=True):
        assert bool(((p.detach().float() - m).abs() <= m.abs() * 2**-7).all())
        moved.append((p.detach().float() - m.to(torch.bfloat16).float()).reshape(-1) != 0)
    assert bool(torch.cat(moved).any())  # some not to nearest: rounded at random
    nearest = _trainer(ckpt, "bfloat16", master_rounding="nearest")
    nearest.train_step(copy.deepcopy(batch))
    for p, m in zip(nearest.params, nearest.optimizer.main_params, strict=True):
        assert torch.equal(p.detach(), m.to(torch.bfloat16))
    exported = {k: v for b in masters.export_weights(1 << 30) for k, v in b.tensors.items()}
    for name, p in masters.model.state_dict().items():
        assert exported[name].dtype == torch.bfloat16 and torch.equal(exported[name], p), name


def test_fp16_loss_scaling_skips_an_overflow_and_backs_off(
        ckpt: Path, batch: list[TrainSample]) -> None:
    """A loss scale of 2**40 overflows float16's gradients: the step is skipped (weights,
    masters and AdamW state untouched), reported (``skipped`` 1, ``loss_scale`` the scale
    used) and the scale halves. At a scale that fits the step is taken, with the float32
    gradient norm, and after ``loss_scale_growth_interval`` good steps the scale doubles."""
    t = _trainer(ckpt, "float16", lr=1e-3, loss_scale_init=2.0**40, loss_scale_growth_interval=2)
    assert t.optimizer.scaler is not None and t.optimizer.scaler.dynamic  # auto: fp16
    before = [p.detach().clone() for p in t.params]
    masters = _flat(t.optimizer.main_params)
    m = t.train_step(copy.deepcopy(batch))
    assert m["skipped"] == 1.0 and m["updates"] == 0.0 and m["loss_scale"] == 2.0**40
    assert t.optimizer.loss_scale == 2.0**39
    assert all(torch.equal(a, b) for a, b in zip(before, t.params, strict=True))
    assert torch.equal(masters, _flat(t.optimizer.main_params)) and not t.optimizer.state
    assert t.version == 1  # the batch counts, as any skipped step

    t.optimizer.scaler.scale = 2.0**10
    m1 = t.train_step(copy.deepcopy(batch))
    assert m1["skipped"] == 0.0 and m1["loss_scale"] == 2.0**10
    assert t.optimizer.loss_scale == 2.0**10  # one good step of two
    m2 = t.train_step(copy.deepcopy(batch))
    assert m2["skipped"] == 0.0 and t.optimizer.loss_scale == 2.0**11
    assert not torch.equal(masters, _flat(t.optimizer.main_params))
    # Unscaled in fp32: the gradient norm is the float32 model's, to float16's precision.
    g32 = _trainer(ckpt, "float32", lr=1e-3).train_step(copy.deepcopy(batch))["grad_norm"]
    assert m1["grad_norm"] == pytest.approx(g32, rel=1e-2)


def test_no_scaling_for_bf16_and_a_fixed_scale_on_request(ckpt: Path) -> None:
    assert _trainer(ckpt, "bfloat16").optimizer.scaler is None  # auto: bf16 has the range
    fixed = _trainer(ckpt, "float16", loss_scale=128.0).optimizer.scaler
    assert fixed is not None and not fixed.dynamic and fixed.scale == 128.0
    fixed.update(False)
    assert fixed.scale == 128.0  # a fixed scale stays


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_checkpoint_round_trips_masters_and_loss_scale(
        ckpt: Path, batch: list[TrainSample], tmp_path: Path, dtype: str) -> None:
    """Save after two steps; a fresh trainer that loads it takes the same third step,
    bit for bit (masters, model, AdamW's moments, the loss scale), as the saving trainer.
    The checkpoint holds the masters in fp32 (not only the rounded model)."""
    opts = {"lr": 1e-4, "loss_scale_growth_interval": 3}
    t = _trainer(ckpt, dtype, **opts)
    for _ in range(2):
        t.train_step(copy.deepcopy(batch))
    t.save_checkpoint(str(tmp_path / "ck"))
    flat = load_file(str(tmp_path / "ck" / "optimizer.safetensors"))
    n = len(t.params)
    assert all(flat[f"{i}.master"].dtype == torch.float32 for i in range(n))
    assert all(flat[f"{i}.exp_avg"].dtype == torch.float32 for i in range(n))
    # the masters carry what the bf16 model file cannot: they are not its rounding
    model_file = load_file(str(tmp_path / "ck" / "model.safetensors"))
    assert any(not torch.equal(flat[f"{i}.master"], flat[f"{i}.master"].to(p.dtype).float())
               for i, p in enumerate(t.params))
    assert all(v.dtype == getattr(torch, dtype) for v in model_file.values())
    state = json.loads((tmp_path / "ck" / "trainer_state.json").read_text())
    if dtype == "float16":
        assert state["param_groups"][0]["loss_scale"] == 2.0**16
        assert state["param_groups"][0]["loss_scale_good_steps"] == 2
    m_cont = t.train_step(copy.deepcopy(batch))

    resumed = _trainer(ckpt, dtype, **opts)
    resumed.load_checkpoint(str(tmp_path / "ck"))
    m_res = resumed.train_step(copy.deepcopy(batch))
    assert m_res["loss"] == m_cont["loss"] and m_res["grad_norm"] == m_cont["grad_norm"]
    assert resumed.optimizer.loss_scale == t.optimizer.loss_scale
    if dtype == "float16":
        assert t.optimizer.loss_scale == 2.0**17  # the third good step doubled it
    for a, b in zip(resumed.optimizer.main_params, t.optimizer.main_params, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(resumed.params, t.params, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(resumed.optimizer.main_params, t.optimizer.main_params, strict=True):
        sa, sb = resumed.optimizer.state[a], t.optimizer.state[b]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_checkpoints_move_between_master_and_plain_trainers(
        ckpt: Path, batch: list[TrainSample], tmp_path: Path) -> None:
    """A bf16 checkpoint without masters loads into a trainer with them (the masters start
    from the loaded weights), and one with masters into a trainer without them (the model
    file has them rounded): switching ``master_weights`` on resume does not fail."""
    plain = _trainer(ckpt, "bfloat16", lr=1e-3, master_weights=False)
    plain.train_step(copy.deepcopy(batch))
    plain.save_checkpoint(str(tmp_path / "plain"))
    up = _trainer(ckpt, "bfloat16", lr=1e-3)
    up.load_checkpoint(str(tmp_path / "plain"))
    for p, m, q in zip(up.params, up.optimizer.main_params, plain.params, strict=True):
        assert torch.equal(p, q) and torch.equal(m, q.float())
    assert not up.train_step(copy.deepcopy(batch))["skipped"]
    up.save_checkpoint(str(tmp_path / "masters"))
    down = _trainer(ckpt, "bfloat16", lr=1e-3, master_weights=False)
    down.load_checkpoint(str(tmp_path / "masters"))
    for p, q in zip(down.params, up.params, strict=True):
        assert torch.equal(p, q)
    assert not down.train_step(copy.deepcopy(batch))["skipped"]


def test_two_bf16_ranks_match_one_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data parallel over gloo with master weights (gradients summed in fp32): the ranks
    stay bit-identical (masters and bf16 model), and their masters took one rank's update
    on the full batch, within 10 % of its size."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_tiny_checkpoint(tmp_path / "model")
    batch = make_batch(ckpt, n_groups=3, group_size=4, seed=5)
    options = {"lr": 1e-4, "micro_batch_size": 2, "seed": 0, "num_threads": 1}
    single = _trainer(ckpt, "bfloat16", **options)
    for _ in range(2):
        single.train_step(copy.deepcopy(batch))
    init = f"file://{tmp_path / 'dist-init'}"
    mp.spawn(run_rank, args=(2, str(ckpt), init, str(tmp_path), batch, 2, options, "bfloat16"),
             nprocs=2, join=True)
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    for name, tensor in ranks[0].items():
        assert tensor.dtype == (torch.float32 if name.startswith("master.") else torch.bfloat16)
        assert torch.equal(tensor, ranks[1][name]), f"ranks diverged on {name}"
    start = _flat([p.float() for p in _trainer(ckpt, "bfloat16").params])
    one = _flat(single.optimizer.main_params)
    two = _flat([ranks[0][f"master.{i}"] for i in range(len(single.params))])
    # Not bit-equal: each rank's micro-batches differ from the single rank's, so do the
    # bf16 forwards' roundings, the gradients, and AdamW's first steps on near-zero ones.
    assert float((two - one).norm() / (one - start).norm()) < 0.1  # measured 0.03


def test_fp16_overflow_is_skipped_on_every_rank(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An overflow on any rank reaches every rank through the gradient sum (inf + x is
    inf): all ranks skip the same steps and back off to the same scale, so they stay in
    lockstep."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_tiny_checkpoint(tmp_path / "model")
    batch = make_batch(ckpt, n_groups=2, group_size=4, seed=5)
    options = {"lr": 1e-3, "micro_batch_size": 2, "seed": 0, "num_threads": 1,
               "loss_scale_init": 2.0**40}
    init = f"file://{tmp_path / 'dist-init'}"
    mp.spawn(run_rank, args=(2, str(ckpt), init, str(tmp_path), batch, 2, options, "float16"),
             nprocs=2, join=True)
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for m0, m1 in zip(infos[0]["metrics"], infos[1]["metrics"], strict=True):
        assert (m0["skipped"], m0["loss_scale"]) == (m1["skipped"], m1["loss_scale"])
    assert infos[0]["metrics"][0]["skipped"] == 1.0
    assert [m["loss_scale"] for m in infos[0]["metrics"]] == [2.0**40, 2.0**39]
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    for name, tensor in ranks[0].items():
        assert torch.equal(tensor, ranks[1][name]), name
