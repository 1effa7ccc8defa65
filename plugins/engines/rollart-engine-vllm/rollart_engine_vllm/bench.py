"""``rollart bench engine --engine vllm``: vLLM vs the torch engine vs static HF generate.

One run, one model, one request mix (the same seeded draws for every side):

- ``vllm``: :class:`rollart_engine_vllm.engine.VllmEngine` (AsyncLLM, ``max_num_seqs`` =
  ``--batch``), every request sent at its arrival time;
- ``torch``: the embedded engine (``max_running`` = ``--batch``), sent the same way;
- ``static``: transformers' ``model.generate`` on the same requests, all available up
  front (the baseline's best case), in arrival order, left-padded batches of ``--batch``
  run until their longest request is done.

Greedy decoding without an end token, so every side produces exactly the tokens each
request asked for; only those count. Each side runs ``--repeats`` timed passes after one
warm-up pass; the median is reported. Capacity: one compute thread per side
(``--threads``); vLLM's engine core runs in its own process, its front end (output
processing) in this one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollart bench engine --engine vllm",
                                description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="vllm", choices=["vllm"],
                   help="the engine compared with torch and static generate")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="an HF checkpoint folder (default: a random Llama of the sizes below)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8, help="head_dim = hidden / heads (vLLM CPU: 32+)")
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--batch", type=int, default=8, help="static batch = engines' running cap")
    p.add_argument("--prompt-len", type=int, nargs=2, default=[16, 160], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[8, 128], metavar=("MIN", "MAX"))
    p.add_argument("--arrival-s", type=float, default=0.5,
                   help="requests arrive uniformly over this many seconds")
    p.add_argument("--threads", type=int, default=1, help="compute threads of every side")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per side (median)")
    p.add_argument("--sides", nargs="+", default=["vllm", "torch", "static"],
                   choices=["vllm", "torch", "static"])
    p.add_argument("--prefix-caching", action="store_true",
                   help="keep vLLM's prefix cache on (off by default: the repeats send the "
                   "same prompts, which only vLLM could then serve from its cache)")
    p.add_argument("--seed", type=int, default=0)
    return p


def workload(n: int, vocab: int, prompt_len: list[int], output_len: list[int],
             arrival_s: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    reqs: list[dict[str, Any]] = []
    for i in range(n):
        plen = rng.randint(*prompt_len)
        reqs.append({
            "id": f"b{i}",
            "prompt": [rng.randrange(3, vocab) for _ in range(plen)],
            "out": rng.randint(*output_len),
            "arrival": rng.uniform(0, arrival_s),
        })
    reqs.sort(key=lambda r: r["arrival"])
    return reqs


async def _serve(engine: Any, reqs: list[dict[str, Any]]) -> float:
    """Seconds from the first arrival to the last completion, requests sent on time."""
    from rollart_sdk.types import GenerationRequest, SamplingParams

    t0 = time.perf_counter()
    tag = f"{time.perf_counter_ns()}-"

    async def one(r: dict[str, Any]) -> None:
        delay = r["arrival"] - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        res = await engine.generate(GenerationRequest(
            f"{tag}{r['id']}", r["prompt"], SamplingParams(temperature=0.0, max_new_tokens=r["out"])
        ))
        if len(res.token_ids) != r["out"]:
            raise RuntimeError(f"{r['id']}: {len(res.token_ids)} tokens ({res.finish_reason}), "
                               f"asked {r['out']}")

    await asyncio.gather(*(one(r) for r in reqs))
    return time.perf_counter() - t0


def _static(model: Any, reqs: list[dict[str, Any]], batch: int) -> float:
    import torch

    t0 = time.perf_counter()
    for start in range(0, len(reqs), batch):
        chunk = reqs[start : start + batch]
        width = max(len(r["prompt"]) for r in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, r in enumerate(chunk):
            ids[row, width - len(r["prompt"]):] = torch.tensor(r["prompt"])
            mask[row, width - len(r["prompt"]):] = 1
        longest = max(r["out"] for r in chunk)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                           max_new_tokens=longest, min_new_tokens=longest, pad_token_id=0,
                           eos_token_id=None)
    return time.perf_counter() - t0


def _engine_side(make: Any, warm: list[dict[str, Any]], reqs: list[dict[str, Any]],
                 repeats: int) -> tuple[list[float], dict[str, Any]]:
    async def go() -> tuple[list[float], dict[str, Any]]:
        engine = make()
        try:
            await _serve(engine, warm)
            times = [await _serve(engine, reqs) for _ in range(repeats)]
            return times, engine.stats()
        finally:
            await engine.shutdown()

    return asyncio.run(go())


def _build_model(args: argparse.Namespace, folder: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, max_position_embeddings=4096,
        pad_token_id=0, eos_token_id=None, bos_token_id=None, tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    return model


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rollart_sdk.config import ModelConfig
    from rollart_sdk.models import load_causal_lm

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="rollart-bench-vllm-") as tmp:
        if args.model:
            path = args.model
            model = load_causal_lm(path).eval()
            vocab = int(model.config.vocab_size)
        else:
            path = tmp
            model = _build_model(args, tmp)
            vocab = args.vocab
        reqs = workload(args.requests, vocab, args.prompt_len, args.output_len,
                        args.arrival_s, args.seed)
        warm = [dict(r, arrival=0.0) for r in reqs[: args.batch]]
        tokens = sum(r["out"] for r in reqs)
        mc = ModelConfig(path=path)
        runs: dict[str, list[float]] = {}
        notes: dict[str, Any] = {}
        if "vllm" in args.sides:
            from rollart_engine_vllm.engine import VllmEngine

            runs["vllm"], st = _engine_side(
                lambda: VllmEngine(model=mc, max_num_seqs=args.batch, eos_token_ids=[],
                                   max_model_len=1024, cpu_threads=args.threads,
                                   cpu_kv_cache_gb=1.0,
                                   enable_prefix_caching=args.prefix_caching),
                warm, reqs, args.repeats)
            notes["vllm"] = {"prefix_cached_tokens": st["prefix_cached_tokens"]}
        if "torch" in args.sides:
            from rollart_engine_torch.engine import TorchEngine

            runs["torch"], st = _engine_side(
                lambda: TorchEngine(model=mc, max_running=args.batch, eos_token_ids=[],
                                    max_seq_len=1024, num_threads=args.threads),
                warm, reqs, args.repeats)
            notes["torch"] = {"steps": st["steps"]}
        if "static" in args.sides:
            _static(model, warm, args.batch)
            runs["static"] = [_static(model, reqs, args.batch) for _ in range(args.repeats)]
            notes["static"] = {"padded_tokens": sum(
                len(reqs[i:i + args.batch]) * max(r["out"] for r in reqs[i:i + args.batch])
                for i in range(0, len(reqs), args.batch))}
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "model": {"path": args.model or "random llama", "params": sum(
            p.numel() for p in model.parameters()), "vocab": vocab},
        "requests": args.requests, "batch": args.batch, "threads": args.threads,
        "repeats": args.repeats, "generated_tokens": tokens,
        "seconds_median": med, "runs_s": runs, "notes": notes,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "ratio_vs_static": {k: med["static"] / v for k, v in med.items() if "static" in med},
        "vllm_vs_torch": med["torch"] / med["vllm"] if {"torch", "vllm"} <= set(med) else None,
    }


def main(argv: list[str] | None = None) -> int:
    """``rollart bench engine --engine vllm``: prints a table, optionally writes JSON."""
    from rich.console import Console
    from rich.table import Table

    args = _parser().parse_args(argv)
    console = Console()
    with console.status("running vllm / torch / static generate..."):
        res = run(args)
    table = Table(title=(
        f"vLLM vs torch engine vs static generate - {res['model']['params'] / 1e6:.1f}M params, "
        f"{res['requests']} requests, batch {res['batch']}, {res['threads']} thread(s), "
        f"median of {res['repeats']}"
    ))
    for col in ("side", "seconds", "generated tok/s", "x static"):
        table.add_column(col)
    for side, sec in res["seconds_median"].items():
        ratio = res["ratio_vs_static"].get(side)
        table.add_row(side, f"{sec:.2f}", f"{res['tokens_per_s'][side]:.0f}",
                      f"{ratio:.2f}x" if ratio else "-")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        console.print(f"wrote {args.json}")
    return 0
