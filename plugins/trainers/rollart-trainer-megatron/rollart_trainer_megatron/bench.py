"""Step time of trainer ``megatron`` against trainer ``torch`` on the same batch.

    rollart bench trainers [--repeats 7] [--batch 32] [--json PATH]

Same random Llama (the quickstart's tiny shape by default), same batch of variable-length
trajectories, same optimiser settings; one warm-up step each, then ``repeats`` steps of
each trainer interleaved (torch, megatron TP 1, torch, ...) in one process, one thread,
so that machine load shifts hit both alike; the median is reported. The two-process
layouts (``--multi``: ``tp2`` tensor parallel, ``pp2`` pipeline parallel through
Megatron's 1F1B schedule, ``dp2`` data parallel, ``dp2-distopt`` with the distributed
optimizer) run afterwards on the same batch over gloo, rank 0's median reported. What it
shows: the cost of the Megatron model, of packing vs padding and of gloo communication on
CPU at this size; not GPU behaviour.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _model(path: Path, vocab: int, hidden: int, layers: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=1024, pad_token_id=0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def _batch(n: int, vocab: int, seed: int) -> list[Any]:
    from rollart_sdk.testing.trainer import random_batch

    return random_batch(n, vocab, seed)


def _time(trainer: Any, batch: list[Any]) -> float:
    t0 = time.perf_counter()
    trainer.train_step(copy.deepcopy(batch))
    return time.perf_counter() - t0


_LAYOUTS: dict[str, dict[str, Any]] = {
    "tp2": {"tensor_parallel_size": 2},
    "pp2": {"pipeline_parallel_size": 2},
    "dp2": {},
    "dp2-distopt": {"use_distributed_optimizer": True},
}


def _rank(rank: int, world: int, path: str, init: str, batch: list[Any], repeats: int,
          options: dict, out: str) -> None:
    torch.set_num_threads(1)
    from rollart_sdk.config import ModelConfig
    from rollart_trainer_megatron.trainer import MegatronTrainer

    t = MegatronTrainer(model=ModelConfig(path=path), rank=rank, world_size=world,
                        init_method=init, **options)
    shard = batch[rank::world]
    _time(t, shard)
    times = [_time(t, shard) for _ in range(repeats)]
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    t.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rollart bench trainers", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--pack-length", type=int, default=None,
                   help="trainer option pack_length (default: the longest trajectory)")
    p.add_argument("--multi", type=str, default="tp2,pp2",
                   help=f"two-process layouts to time, comma-separated, of {sorted(_LAYOUTS)} "
                        "('' for none)")
    p.add_argument("--json", type=str, default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    import torch.multiprocessing as mp
    from rollart_trainer_torch.trainer import TorchTrainer

    from rollart_sdk.config import ModelConfig
    from rollart_trainer_megatron.trainer import MegatronTrainer

    common: dict[str, Any] = {"lr": 1e-3, "seed": 0, "num_threads": 1}
    with tempfile.TemporaryDirectory(prefix="rollart-bench-trainers-") as tmp:
        path = _model(Path(tmp) / "model", a.vocab, a.hidden, a.layers)
        batch = _batch(a.batch, a.vocab, seed=0)
        tokens = sum(len(s.input_ids) for s in batch)
        torch_t = TorchTrainer(model=ModelConfig(path=str(path)), micro_batch_size=64, **common)
        packing = {"pack_length": a.pack_length, "max_tokens_per_micro_batch": 8192}
        meg_t = MegatronTrainer(model=ModelConfig(path=str(path)), **packing, **common)
        _time(torch_t, batch)
        _time(meg_t, batch)
        times: dict[str, list[float]] = {"torch (padded, 1 micro-batch)": [],
                                         f"megatron TP1 (pack_length {a.pack_length or 'auto'})": []}
        for _ in range(a.repeats):
            times["torch (padded, 1 micro-batch)"].append(_time(torch_t, batch))
            times[f"megatron TP1 (pack_length {a.pack_length or 'auto'})"].append(_time(meg_t, batch))
        meg_t.close()
        for layout in filter(None, a.multi.split(",")):
            if layout not in _LAYOUTS:
                p.error(f"--multi: unknown layout {layout!r}; choose from {sorted(_LAYOUTS)}")
            out = str(Path(tmp) / f"{layout}.json")
            mp.spawn(_rank, args=(2, str(path), f"file://{tmp}/init-{layout}", batch, a.repeats,
                                  {**common, **packing, **_LAYOUTS[layout]}, out),
                     nprocs=2, join=True)
            times[f"megatron {layout.upper()} (2 processes)"] = json.loads(Path(out).read_text())
    rows = {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)}
            for k, v in times.items()}
    print(f"batch: {a.batch} trajectories, {tokens} tokens; model hidden {a.hidden}, "
          f"{a.layers} layers, vocab {a.vocab}; {a.repeats} repeats, 1 thread per process")
    print(f"{'trainer':40s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for k, r in rows.items():
        print(f"{k:40s} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"tokens": tokens, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
