"""Trainer step time on CPU and on a CUDA device, same model, same batch, one process.

    python scripts/device_bench.py [--hidden 768 --layers 12 --vocab 32000] [--json PATH]

Trainer ``torch`` on the CPU (all cores), trainer ``torch`` on the GPU and trainer
``megatron`` (TP 1, where megatron-core is installed) on the GPU take the same GRPO step
on the same batch of variable-length trajectories from the same random Llama: one warm-up
step each, then ``--repeats`` steps interleaved, median reported. Run on a GPU machine; on
a CPU-only one it times the CPU row alone. What it shows: the embedded trainers' step time
on a GPU for a GPT-2-small-sized model, against the same machine's CPU; not multi-GPU
scaling, not the engines (``rollart bench engine --device cuda`` times those).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _time(trainer: Any, batch: list[Any]) -> float:
    t0 = time.perf_counter()
    trainer.train_step(copy.deepcopy(batch))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _trainers(path: str, cores: int, common: dict[str, Any]) -> dict[str, Any]:
    """Trainer torch on the CPU; on a GPU machine also torch and megatron on cuda."""
    from rollart_trainer_torch.trainer import TorchTrainer

    from rollart_sdk.config import ModelConfig

    out: dict[str, Any] = {
        f"torch, cpu ({cores} threads)": TorchTrainer(
            model=ModelConfig(path=path), micro_batch_size=8, device="cpu",
            num_threads=cores, **common),
    }
    if not torch.cuda.is_available():
        return out
    out["torch, cuda"] = TorchTrainer(model=ModelConfig(path=path), micro_batch_size=32,
                                      device="cuda", **common)
    try:
        from rollart_trainer_megatron.trainer import MegatronTrainer
    except ImportError as exc:
        print(f"megatron row skipped: {exc}")
        return out
    out["megatron TP1, cuda"] = MegatronTrainer(model=ModelConfig(path=path), device="cuda",
                                                max_tokens_per_micro_batch=16384, **common)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cpu-repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from rollart_sdk.testing.trainer import random_batch, tiny_llama_checkpoint

    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    common = {"lr": 1e-5, "seed": 0}
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rollart-device-bench-") as tmp:
        path = str(tiny_llama_checkpoint(Path(tmp) / "m", vocab=a.vocab, hidden=a.hidden,
                                         layers=a.layers, heads=a.heads, kv_heads=a.heads,
                                         intermediate=4 * a.hidden))
        batch = random_batch(a.batch, a.vocab, 0, prompt=(40, 119), action=(16, 239))
        tokens = sum(len(s.input_ids) for s in batch)
        trainers = _trainers(path, cores, common)
        times: dict[str, list[float]] = {k: [] for k in trainers}
        for t in trainers.values():
            _time(t, batch)  # warm-up
        for i in range(a.repeats):
            for name, t in trainers.items():
                if name.startswith("torch, cpu") and i >= a.cpu_repeats:
                    continue
                times[name].append(_time(t, batch))
        params = sum(p.numel() for p in trainers[next(iter(trainers))].model.parameters())
        for t in trainers.values():
            close = getattr(t, "close", None)
            if callable(close):
                close()
        for name, v in times.items():
            rows[name] = {"median_s": statistics.median(v), "runs_s": v,
                          "tokens_per_s": tokens / statistics.median(v)}
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"model: Llama hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}, "
          f"{params / 1e6:.0f}M params; batch {a.batch} trajectories, {tokens} tokens; GPU {gpu}")
    print(f"{'trainer':28s} {'median s':>9s} {'tokens/s':>10s}  runs")
    for name, r in rows.items():
        runs = " ".join(f"{x:.3f}" for x in r["runs_s"])
        print(f"{name:28s} {r['median_s']:9.3f} {r['tokens_per_s']:10.0f}  {runs}")
    if a.json:
        Path(a.json).write_text(json.dumps({"params": params, "tokens": tokens, "gpu": gpu,
                                            "cpu_threads": cores, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
