"""Pipeline parallelism through megatron-core's 1F1B schedule on CPU (gloo): the stage
layout, and PP = 2 against PP = 1 on the same batch and weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from _rank_worker import steps
from megatron_helpers import make_batch, make_checkpoint
from rollart_trainer_megatron.convert import Arch, megatron_names
from rollart_trainer_megatron.pipeline import Stage
from safetensors.torch import load_file
from transformers import AutoConfig

STEPS = 2


def test_stage_layout(tmp_path: Path) -> None:
    """Every global parameter lives on exactly one stage under a local layer index; the
    last stage of a tied model holds the embedding's copy as output_layer.weight."""
    ckpt = make_checkpoint(tmp_path / "model", kind="qwen3", tie=True)
    hf = AutoConfig.from_pretrained(ckpt)
    hf.num_hidden_layers = 4
    arch = Arch.from_hf(hf)
    first, last = (Stage.of(arch, 2, r).local_to_global(arch) for r in (0, 1))
    assert first["decoder.layers.1.mlp.linear_fc2.weight"] == "decoder.layers.1.mlp.linear_fc2.weight"
    assert last["decoder.layers.1.mlp.linear_fc2.weight"] == "decoder.layers.3.mlp.linear_fc2.weight"
    assert last["output_layer.weight"] == "embedding.word_embeddings.weight"
    assert "embedding.word_embeddings.weight" in first
    assert "decoder.final_layernorm.weight" in last
    owned = [g for g in first.values()] + [g for n, g in last.items() if n != "output_layer.weight"]
    assert sorted(owned) == sorted(megatron_names(arch))
    with pytest.raises(ValueError, match="must divide the model's 4 layers"):
        Stage.of(arch, 3, 0)


def test_pipeline_parallel_matches_pp1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PP = 2 (two processes, Megatron's 1F1B schedule over gloo, several micro-batches,
    KL to a pipelined reference, tied embeddings split over the first and last stage)
    gives PP = 1's loss, grad norm and weights within 1e-5 after two steps (the second on
    stale tokens). The untied PP layout runs in the conformance kit (pp2-dp1)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_checkpoint(tmp_path / "model", kind="qwen3", tie=True)
    batch = make_batch(ckpt, n_groups=2, group_size=4, seed=7)
    common = {"lr": 1e-2, "seed": 0, "num_threads": 1, "kl_coef": 0.1, "pack_length": 30,
              "max_tokens_per_micro_batch": 30}
    runs = {}
    for pp in (1, 2):
        out = tmp_path / f"pp{pp}"
        out.mkdir()
        mp.spawn(steps, args=(pp, str(ckpt), f"file://{out / 'init'}", str(out), batch,
                              {**common, "pipeline_parallel_size": pp}, STEPS),
                 nprocs=pp, join=True)
        runs[pp] = ([load_file(str(out / f"rank{r}.safetensors")) for r in range(pp)],
                    [json.loads((out / f"rank{r}.json").read_text()) for r in range(pp)])
    (w1, i1), (w2, i2) = runs[1], runs[2]
    start = load_file(str(ckpt / "model.safetensors"))
    assert set(w2[0]) == set(w1[0])
    for name, tensor in w1[0].items():
        assert torch.equal(w2[1][name], w2[0][name]), f"stages export different {name}"
        err = (w2[0][name] - tensor).abs().max().item()
        assert err < 1e-5, f"{name}: PP 2 differs from PP 1 by {err:.3g}"
        if name in start:
            assert not torch.equal(tensor, start[name]), f"{name} did not move"
    for step in range(STEPS):
        a, b = i2[0]["metrics"][step], i1[0]["metrics"][step]
        assert a == i2[1]["metrics"][step]  # both stages report the whole-batch metrics
        assert a["micro_batches"] > 1
        for key in ("loss", "grad_norm", "kl", "clip_frac", "tokens", "stale_frac", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (step, key)
    assert i1[0]["metrics"][1]["stale_frac"] == 1.0
