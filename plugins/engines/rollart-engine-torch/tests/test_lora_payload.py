"""Engine 'torch' serving LoRA adapter payloads (rollart_sdk.weights.lora): every version
is merged against the base weights (not on top of the previous merge), full tensors and
adapters mix, and a bad payload leaves the engine serving what it served."""

from __future__ import annotations

import asyncio

import pytest
import torch
from rollart_engine_torch.engine import TorchEngine

from rollart_sdk.types import GenerationRequest, SamplingParams
from rollart_sdk.weights import split_buckets
from rollart_sdk.weights.lora import adapter_names

Q = "model.layers.0.self_attn.q_proj.weight"
UP = "model.layers.1.mlp.up_proj.weight"


def _adapter(params: dict[str, torch.Tensor], seed: int, rank: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for w in (Q, UP):
        n_out, n_in = params[w].shape
        a_name, b_name = adapter_names(w)
        out[a_name] = torch.randn(rank, n_in, generator=g) * 0.1
        out[b_name] = torch.randn(n_out, rank, generator=g) * 0.1
    return out


def test_adapters_merge_against_the_base_each_version(tiny_model):
    async def run():
        engine = TorchEngine(model=tiny_model, max_running=2, eos_token_ids=[])
        params = engine._runner.model.state_dict()
        base = {k: v.clone() for k, v in params.items()}
        results = []
        for version, seed in ((1, 1), (2, 2)):
            payload = _adapter(base, seed)
            # version 2: a tensor per bucket, so each pair straddles two buckets
            bucket_bytes = 1 << 20 if version == 1 else 500
            buckets = list(split_buckets(payload.items(), bucket_bytes, version))
            assert len(buckets) == (1 if version == 1 else len(payload))
            assert await engine.load_weights(buckets, version) == 0
            for w in (Q, UP):
                a, b = payload[adapter_names(w)[0]], payload[adapter_names(w)[1]]
                torch.testing.assert_close(params[w], base[w] + b @ a, atol=1e-6, rtol=0)
            untouched = "model.layers.0.self_attn.k_proj.weight"
            assert torch.equal(params[untouched], base[untouched])
            req = GenerationRequest(f"r{version}", [5, 9, 11, 3],
                                    SamplingParams(temperature=1.0, seed=0, max_new_tokens=6))
            results.append(await engine.generate(req))
        # A full tensor of an adapted weight becomes its base for the next adapter.
        new_q = torch.randn_like(base[Q])
        payload = {Q: new_q, **_adapter(base, 3)}
        await engine.load_weights(split_buckets(payload.items(), 1 << 20, 3), 3)
        a, b = payload[adapter_names(Q)[0]], payload[adapter_names(Q)[1]]
        torch.testing.assert_close(params[Q], new_q + b @ a, atol=1e-6, rtol=0)
        await engine.shutdown()
        return results

    results = asyncio.run(run())
    assert [r.versions[-1] for r in results] == [1, 2]


@pytest.mark.parametrize("bad", ["unpaired", "shape", "unknown"])
def test_bad_adapter_payloads_leave_the_engine_as_it_was(tiny_model, bad):
    async def run():
        engine = TorchEngine(model=tiny_model, max_running=2, eos_token_ids=[])
        params = engine._runner.model.state_dict()
        before = {k: v.clone() for k, v in params.items()}
        payload = _adapter(before, 1)
        a_name, b_name = adapter_names(Q)
        if bad == "unpaired":
            del payload[b_name]
        elif bad == "shape":
            payload[a_name] = torch.zeros(2, 7)
        else:
            payload.update(zip(adapter_names("model.layers.0.nope.weight"),
                               (torch.zeros(2, 3), torch.zeros(3, 2)), strict=True))
        with pytest.raises(ValueError, match="LoRA payload") as info:
            await engine.load_weights(split_buckets(payload.items(), 1 << 20, 1), 1)
        assert engine.version == 0
        assert all(torch.equal(params[k], before[k]) for k in before)
        await engine.shutdown()
        return str(info.value)

    msg = asyncio.run(run())
    assert {"unpaired": "is missing", "shape": "the served model's weight is",
            "unknown": "not a parameter"}[bad] in msg
