"""The conformance kit and torch-trainer equivalence with real ranks (gloo on CPU):
TP=2/DP=1 and TP=1/DP=2, each rank a process handed its shard as the pipeline does."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from _rank_worker import conformance, steps
from megatron_helpers import make_batch, make_checkpoint
from rollart_trainer_torch.trainer import TorchTrainer
from safetensors.torch import load_file

from rollart_sdk.config import ModelConfig

LAYOUTS = [pytest.param(2, 1, id="tp2-dp1"), pytest.param(1, 2, id="tp1-dp2")]
# (tp, pp, dp, distributed optimizer)
KIT_LAYOUTS = [pytest.param(2, 1, 1, False, id="tp2-dp1"),
               pytest.param(1, 1, 2, False, id="tp1-dp2"),
               pytest.param(1, 1, 2, True, id="tp1-dp2-distopt"),
               pytest.param(1, 2, 1, False, id="pp2-dp1")]
STEPS = 2


@pytest.mark.parametrize("tp,pp,dp,distopt", KIT_LAYOUTS)
def test_conformance_kit_on_real_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       tp: int, pp: int, dp: int, distopt: bool) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_checkpoint(tmp_path / "model", kind="qwen3")
    batch = make_batch(ckpt, n_groups=2, group_size=4, seed=1)
    world = tp * pp * dp
    options = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "lr": 1e-3,
               "seed": 0, "num_threads": 1,
               "kl_coef": 0.05, "pack_length": 30,
               "max_tokens_per_micro_batch": 30, "use_distributed_optimizer": distopt}
    mp.spawn(conformance, args=(world, str(ckpt), f"file://{tmp_path / 'init'}",
                                str(tmp_path), batch, options), nprocs=world, join=True)
    reports = [json.loads((tmp_path / f"kit{r}.json").read_text()) for r in range(world)]
    assert reports[0]["buckets"] > 1  # the bucket bound was exercised
    assert reports[0]["loss_after"] < reports[0]["loss_before"]
    for r in reports[1:]:
        assert r["metrics"]["loss"] == reports[0]["metrics"]["loss"]
        assert r["loss_after"] == reports[0]["loss_after"]
    m = reports[0]["metrics"]
    assert m["tokens"] == sum(sum(s.loss_mask) for s in batch)
    assert m["micro_batches"] > 1  # several forwards on this rank ...
    assert m["packed_rows"] < len(batch) // dp  # ... of rows holding several trajectories
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # behaviour == trainer numerics


@pytest.mark.parametrize("tp,dp", LAYOUTS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_matches_the_torch_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   tp: int, dp: int, agg: str) -> None:
    """Same batch, same initial weights, two steps (the second on stale tokens): loss,
    grad norm and exported weights equal the torch trainer's within 1e-4."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_checkpoint(tmp_path / "model", kind="qwen3")
    batch = make_batch(ckpt, n_groups=3, group_size=4, seed=5)
    common = {"lr": 1e-3, "seed": 0, "num_threads": 1, "kl_coef": 0.1, "loss_agg": agg}
    ref = TorchTrainer(model=ModelConfig(path=str(ckpt)), micro_batch_size=3, **common)
    want_metrics = [ref.train_step(copy.deepcopy(batch)) for _ in range(STEPS)]
    want = {k: v.detach() for k, v in ref.model.state_dict().items()}

    options = {**common, "tensor_parallel_size": tp, "pack_length": 32,
               "max_tokens_per_micro_batch": 64}
    mp.spawn(steps, args=(tp * dp, str(ckpt), f"file://{tmp_path / 'init'}", str(tmp_path),
                          batch, options, STEPS), nprocs=tp * dp, join=True)
    got = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(tp * dp)]
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(tp * dp)]
    assert all(i["version"] == STEPS for i in infos)
    for name, tensor in want.items():
        for r in range(1, tp * dp):
            assert torch.equal(got[r][name], got[0][name]), f"ranks differ on {name}"
        err = (got[0][name] - tensor).abs().max().item()
        assert err < 1e-4, f"{name}: megatron differs from torch by {err:.3g}"
    for step in range(STEPS):
        m, w = infos[0]["metrics"][step], want_metrics[step]
        for key in ("loss", "grad_norm", "kl", "clip_frac", "tokens", "stale_frac",
                    "behaviour_ratio_mean", "behaviour_ratio_max"):
            assert m[key] == pytest.approx(w[key], rel=1e-4, abs=1e-5), (step, key)
    assert want_metrics[1]["stale_frac"] == 1.0  # the second step went through TIS


def test_distributed_optimizer_matches_the_plain_one(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """DP 2, three steps: AdamW state sharded over the DP ranks (reduce-scatter, sharded
    step, all-gather) gives the loss, grad norm and weights of the plain optimizer within
    1e-5, and each rank holds about half of the AdamW state."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_checkpoint(tmp_path / "model", kind="qwen3")
    batch = make_batch(ckpt, n_groups=2, group_size=4, seed=3)
    runs = {}
    for distopt in (False, True):
        out = tmp_path / f"distopt{int(distopt)}"
        out.mkdir()
        options = {"lr": 1e-2, "seed": 0, "num_threads": 1, "grad_clip": 0.5,
                   "weight_decay": 0.1, "use_distributed_optimizer": distopt}
        mp.spawn(steps, args=(2, str(ckpt), f"file://{out / 'init'}", str(out), batch,
                              options, 3), nprocs=2, join=True)
        runs[distopt] = ([load_file(str(out / f"rank{r}.safetensors")) for r in range(2)],
                         [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)])
    (plain_w, plain_i), (dist_w, dist_i) = runs[False], runs[True]
    start = load_file(str(ckpt / "model.safetensors"))
    assert all(not torch.equal(dist_w[0][k], start[k]) for k in start)  # every tensor moved
    for name, tensor in plain_w[0].items():
        assert torch.equal(dist_w[1][name], dist_w[0][name]), f"ranks differ on {name}"
        err = (dist_w[0][name] - tensor).abs().max().item()
        assert err < 1e-5, f"{name}: distributed optimizer differs by {err:.3g}"
    for step in range(3):
        m, w = dist_i[0]["metrics"][step], plain_i[0]["metrics"][step]
        for key in ("loss", "grad_norm"):
            assert m[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), (step, key)
    assert plain_i[0]["metrics"][0]["grad_norm"] > 0.5  # the clip was exercised
    n = plain_i[0]["param_numel"]
    assert plain_i[0]["state_numel"] == 2 * n  # exp_avg + exp_avg_sq of every parameter
    for info in dist_i:
        assert info["state_numel"] == 2 * -(-n // 2)  # this rank's half of the moments


def test_a_replica_without_trajectories_still_steps(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """DP 2 on a one-trajectory batch: rank 1's shard is empty, it skips the schedule,
    contributes zero gradients to the reduce-scatter (distributed optimizer), and both
    ranks end the step with the same, updated weights and whole-batch metrics."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_checkpoint(tmp_path / "model", kind="gqa")
    batch = make_batch(ckpt, n_groups=1, group_size=2, seed=2)[:1]  # rank 1: empty shard
    batch[0].advantage = 1.0
    mp.spawn(steps, args=(2, str(ckpt), f"file://{tmp_path / 'init'}", str(tmp_path), batch,
                          {"lr": 1e-2, "num_threads": 1, "use_distributed_optimizer": True}, 1),
             nprocs=2, join=True)
    got = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    start = load_file(str(ckpt / "model.safetensors"))
    for name, tensor in got[0].items():
        assert torch.equal(got[1][name], tensor), name
    assert not torch.equal(got[0]["model.norm.weight"], start["model.norm.weight"])
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert infos[1]["metrics"][0]["tokens"] == infos[0]["metrics"][0]["tokens"] > 0
