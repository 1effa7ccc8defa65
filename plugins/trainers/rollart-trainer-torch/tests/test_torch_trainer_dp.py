"""Data parallelism with two real ranks (torch.distributed, gloo on CPU)."""

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

OPTIONS = {"lr": 1e-3, "micro_batch_size": 2, "seed": 0, "num_threads": 1, "kl_coef": 0.1}
STEPS = 2


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_two_ranks_match_one_rank_on_the_full_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agg: str
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_tiny_checkpoint(tmp_path / "model")
    # 3 groups of 4 over 2 ranks: rank r gets batch[r::2], so every group is split
    # across ranks and per-shard advantages would be wrong.
    batch = make_batch(ckpt, n_groups=3, group_size=4, seed=5)
    options = {**OPTIONS, "loss_agg": agg}

    single = TorchTrainer(model=ModelConfig(path=str(ckpt)), **options)
    single_metrics = [single.train_step(copy.deepcopy(batch)) for _ in range(STEPS)]
    want = single.model.state_dict()

    init = f"file://{tmp_path / 'dist-init'}"
    mp.spawn(
        run_rank,
        args=(2, str(ckpt), init, str(tmp_path), batch, STEPS, options),
        nprocs=2,
        join=True,
    )
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    assert [i["version"] for i in infos] == [STEPS, STEPS]
    for name, tensor in want.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), f"ranks diverged on {name}"
        assert torch.allclose(ranks[0][name], tensor, atol=2e-5), (
            f"{name}: 2 ranks differ from 1 rank by "
            f"{(ranks[0][name] - tensor).abs().max().item():.3g}"
        )
    for step in range(STEPS):
        m0, m1 = infos[0]["metrics"][step], infos[1]["metrics"][step]
        ms = single_metrics[step]
        for key in ("loss", "grad_norm", "tokens", "clip_frac", "kl", "entropy"):
            assert m0[key] == m1[key], key
            assert m0[key] == pytest.approx(ms[key], rel=1e-4, abs=1e-6), key
    assert single_metrics[1]["kl"] > 0  # the reference is frozen, the policy moved
