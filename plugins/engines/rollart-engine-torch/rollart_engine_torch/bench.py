"""``rollart bench engine``: engine 'torch' versus transformers' static ``generate``.

Workload: requests of varied prompt and output lengths arriving over time, greedy, on a
small random Llama model (no eos, so both sides produce exactly the requested tokens).

- engine: every request is sent at its arrival time; continuous batching up to
  ``--batch`` running sequences;
- static: the same requests, all available up front (the baseline's best case), in
  arrival order, in batches of ``--batch``; each batch is left-padded and runs
  ``model.generate`` until its longest request is done (the classic static batch).

Both count only the tokens each request asked for, on the same model with the same torch
thread count. The figure of merit is ``ratio_vs_static`` = engine tokens/s divided by
static tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollart bench engine", description=__doc__.split("\n")[0])
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")
    p.add_argument("--hidden", type=int, default=256, help="hidden size")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--batch", type=int, default=8, help="static batch size = engine max_running")
    p.add_argument("--prompt-len", type=int, nargs=2, default=[16, 160], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[8, 128], metavar=("MIN", "MAX"))
    p.add_argument("--arrival-s", type=float, default=0.5,
                   help="requests arrive uniformly over this many seconds")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both sides)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per side (best kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu",
                   help="torch device of both sides (cpu, cuda, cuda:N)")
    return p


def _workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    reqs: list[dict[str, Any]] = []
    for i in range(args.requests):
        n = rng.randint(*args.prompt_len)
        reqs.append({
            "id": f"b{i}",
            "prompt": [rng.randrange(3, args.vocab) for _ in range(n)],
            "out": rng.randint(*args.output_len),
            "arrival": rng.uniform(0, args.arrival_s),
        })
    reqs.sort(key=lambda r: r["arrival"])
    return reqs


def _static(model: Any, reqs: list[dict[str, Any]], batch: int) -> float:
    """Seconds for transformers' generate over the workload in static batches."""
    import torch

    device = next(model.parameters()).device
    t0 = time.perf_counter()
    for start in range(0, len(reqs), batch):
        chunk = reqs[start : start + batch]
        width = max(len(r["prompt"]) for r in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, r in enumerate(chunk):  # left padding, as decoder-only generate expects
            ids[row, width - len(r["prompt"]) :] = torch.tensor(r["prompt"])
            mask[row, width - len(r["prompt"]) :] = 1
        longest = max(r["out"] for r in chunk)
        with torch.inference_mode():
            model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False, max_new_tokens=longest,
                min_new_tokens=longest, pad_token_id=0, eos_token_id=None,
            )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


async def _engine(engine: Any, reqs: list[dict[str, Any]]) -> float:
    """Seconds from the first arrival to the last completion, requests sent on time."""
    from rollart_sdk.types import GenerationRequest, SamplingParams

    t0 = time.perf_counter()

    async def one(r: dict[str, Any], tag: str) -> int:
        delay = r["arrival"] - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        res = await engine.generate(GenerationRequest(
            f"{tag}{r['id']}", r["prompt"], SamplingParams(temperature=0.0, max_new_tokens=r["out"])
        ))
        assert len(res.token_ids) == r["out"], (res.finish_reason, len(res.token_ids), r["out"])
        return len(res.token_ids)

    tag = f"{time.perf_counter_ns()}-"
    await asyncio.gather(*(one(r, tag) for r in reqs))
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rollart_engine_torch.engine import TorchEngine
    from rollart_sdk.config import ModelConfig

    torch.set_num_threads(args.threads)
    cfg = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads or args.heads, max_position_embeddings=4096,
        pad_token_id=0, eos_token_id=None, bos_token_id=None,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    reqs = _workload(args)
    tokens = sum(r["out"] for r in reqs)
    warm = [dict(r, arrival=0.0) for r in reqs[: args.batch]]
    with tempfile.TemporaryDirectory(prefix="rollart-bench-") as tmp:
        model.save_pretrained(tmp)
        engine = TorchEngine(
            model=ModelConfig(path=tmp), max_running=args.batch, eos_token_ids=[],
            num_threads=args.threads, device=args.device,
        )

        async def engine_runs() -> list[float]:
            await _engine(engine, warm)
            times = [await _engine(engine, reqs) for _ in range(args.repeats)]
            stats = engine.stats()
            await engine.shutdown()
            out.update(engine_steps=stats["steps"], kv_cache_bytes=stats["kv_cache_bytes"])
            return times

        out: dict[str, Any] = {}
        engine_times = asyncio.run(engine_runs())
    model.to(args.device)
    _static(model, warm, args.batch)
    static_times = [_static(model, reqs, args.batch) for _ in range(args.repeats)]
    e, s = min(engine_times), min(static_times)
    out.update(
        model={"hidden": args.hidden, "layers": args.layers, "heads": args.heads,
               "kv_heads": args.kv_heads or args.heads, "intermediate": args.intermediate,
               "vocab": args.vocab, "params": sum(p.numel() for p in model.parameters())},
        requests=args.requests, batch=args.batch, threads=args.threads, device=args.device,
        generated_tokens=tokens,
        static_padded_tokens=sum(
            len(reqs[i : i + args.batch]) * max(r["out"] for r in reqs[i : i + args.batch])
            for i in range(0, len(reqs), args.batch)
        ),
        engine_seconds=e, static_seconds=s,
        engine_tokens_per_s=tokens / e, static_tokens_per_s=tokens / s,
        ratio_vs_static=s / e,
        engine_runs_s=engine_times, static_runs_s=static_times,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rollart bench engine``; prints a table, optionally writes JSON."""
    from rich.console import Console
    from rich.table import Table

    args = _parser().parse_args(argv)
    console = Console()
    with console.status("running engine vs static generate..."):
        res = run(args)
    m = res["model"]
    table = Table(title=(
        f"engine 'torch' vs static generate - {m['params'] / 1e6:.1f}M params, "
        f"{res['requests']} requests, batch {res['batch']}, {res['threads']} thread(s), "
        f"{res['device']}"
    ))
    for col in ("side", "seconds", "generated tok/s", "note"):
        table.add_column(col)
    table.add_row("engine (continuous)", f"{res['engine_seconds']:.2f}",
                  f"{res['engine_tokens_per_s']:.0f}", f"{res['engine_steps']} steps")
    table.add_row("static generate", f"{res['static_seconds']:.2f}",
                  f"{res['static_tokens_per_s']:.0f}",
                  f"{res['static_padded_tokens']} decoded for {res['generated_tokens']} used")
    table.add_row("ratio", "", f"{res['ratio_vs_static']:.2f}x", "target >= 0.8")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        console.print(f"wrote {args.json}")
    return 0
