"""``rollart bench async``: sync vs one_off vs async (alpha = 1, 2) on one workload.

Each configuration runs the real pipeline in-process (``build_job(in_process=True)``: the
torch engine behind the LLMProxy, the torch trainer, the ``local`` weight transport, the
RolloutScheduler and SampleBuffer) for the same number of steps, with the same seed and
the same task: a FrozenLake-like multi-turn env (``bench-latency``: one constrained action
word per turn) whose every step takes a latency drawn from N(mu, sigma), truncated at 0,
so that rollout is environment-bound with a long tail, as in agentic RL.

All configurations get the same environment capacity (``--max-envs``, default two
batches), so differences come from the protocol alone: sync launches one batch, waits
for its slowest trajectory, for training and for the weight update before launching
again; one_off launches the next batch right after the update so its rollout overlaps
training; async keeps every environment busy and bounds staleness by alpha (aborting what
could only land past it). sync and one_off launch by quota (one batch per step), so they
use at most one batch of the capacity.

Reported per configuration: step time (wall / steps), trajectories trained per second,
the staleness histogram of trained trajectories (trainer version - start version),
trajectories aborted as stale or surplus, dropped ones by reason, exposed weight-sync and
transfer time (the pipeline's ``time/weight_sync`` and ``time/weight_transfer``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rollart_sdk.bench.straggler import latency_config, latency_registry, wide_executor

CONFIGS: list[tuple[str, int]] = [("sync", 0), ("one_off", 1), ("async", 1), ("async", 2)]


async def _drive(job: Any, steps: int, threads: int) -> tuple[list[Any], list[dict[str, Any]], float]:
    pool = wide_executor(asyncio.get_running_loop(), threads)
    metrics: list[dict[str, Any]] = []

    def on_step(rec: Any, m: dict[str, Any]) -> None:
        metrics.append(m)
        job.run_dir.log_metrics(m)

    job.pipeline.on_step = on_step
    t0 = time.perf_counter()
    try:
        records = await job.pipeline.run(steps)
    finally:
        pool.shutdown(wait=False)
    return records, metrics, time.perf_counter() - t0


def run_config(mode: str, alpha: int, steps: int, env_options: dict[str, Any], turns: int,
               batch: int, group: int, max_envs: int, seed: int, registry: Any) -> dict[str, Any]:
    """One configuration, start to end, in its own temporary run directory."""
    from rollart_sdk.config import load_config
    from rollart_sdk.train import build_job

    rollout = {"batch_size": batch, "group_size": group, "mode": mode, "alpha": max(alpha, 1),
               "max_envs": max_envs}
    with tempfile.TemporaryDirectory(prefix=f"rollart-bench-async-{mode}-") as tmp:
        cfg, lines = load_config(data=latency_config(env_options, turns, tmp, seed, rollout,
                                                     max_running=max_envs + 8))
        job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry)
        try:
            records, metrics, wall = asyncio.run(_drive(job, steps, 2 * max_envs + 16))
        finally:
            job.run_dir.close()
            job.close()
        p = job.pipeline
    hist: Counter[int] = Counter()
    for rec in records:
        hist.update(rec.version - t.start_version for t in rec.batch)
    trained = sum(len(r.batch) for r in records)
    synced = [r for r in records if r.weight_transfer_s or r.weight_sync_exposed_s]
    dropped = dict(p.buffer.dropped)
    return {
        "mode": mode,
        "alpha": p.alpha,
        "steps": len(records),
        "wall_s": wall,
        "step_time_s": wall / max(1, len(records)),
        "trajectories_per_s": trained / wall,
        "trajectories_trained": trained,
        "launched": p.scheduler.launched,
        "staleness_hist": {str(k): v for k, v in sorted(hist.items())},
        "staleness_max": max(hist) if hist else 0,
        "aborted_stale": sum(r.aborted_stale for r in records),
        "aborted_surplus": sum(r.aborted_surplus for r in records),
        "dropped": dropped,
        # What was lost while running (the run's end aborts what is still in flight).
        "dropped_during_run": sum(n for k, n in dropped.items() if "run_end" not in k),
        "get_batch_wait_s_mean": sum(r.get_batch_wait_s for r in records) / max(1, len(records)),
        "train_s_mean": sum(r.train_s for r in records) / max(1, len(records)),
        "weight_sync_exposed_s_mean": (sum(r.weight_sync_exposed_s for r in synced) / len(synced)
                                       if synced else 0.0),
        "weight_transfer_s_mean": (sum(r.weight_transfer_s for r in synced) / len(synced)
                                   if synced else 0.0),
        "step_wall_times": [m["wall_time"] for m in metrics],
    }


def run(steps: int = 8, turns: int = 4, mu: float = 0.1, sigma_over_mu: float = 0.5,
        batch: int = 8, group: int = 4, max_envs: int | None = None, seed: int = 0,
        configs: list[tuple[str, int]] | None = None) -> dict[str, Any]:
    if batch % group:
        raise ValueError(f"--batch ({batch}) must be a multiple of --group ({group})")
    envs = max_envs or 2 * batch
    registry = latency_registry()
    opts = {"turns": turns, "mu": mu, "sigma": sigma_over_mu * mu}
    rows = [run_config(mode, alpha, steps, opts, turns, batch, group, envs, seed, registry)
            for mode, alpha in (configs or CONFIGS)]
    return {"benchmark": "async", "steps": steps, "turns": turns, "mu": mu,
            "sigma_over_mu": sigma_over_mu, "batch_size": batch, "group_size": group,
            "max_envs": envs, "seed": seed, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rollart bench async``; prints a table, optionally writes JSON."""
    parser = argparse.ArgumentParser(prog="rollart bench async",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=8, help="training steps per configuration")
    parser.add_argument("--turns", type=int, default=4, help="env steps per episode")
    parser.add_argument("--mu", type=float, default=0.1, help="mean env step latency (s)")
    parser.add_argument("--sigma-over-mu", type=float, default=0.5, help="latency spread")
    parser.add_argument("--batch", type=int, default=8, help="trajectories per training step")
    parser.add_argument("--group", type=int, default=4, help="GRPO group size")
    parser.add_argument("--max-envs", type=int, default=None,
                        help="environment capacity, same for every configuration (default: 2 * --batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.turns < 1 or args.mu < 0 or args.sigma_over_mu < 0:
        parser.error("--steps and --turns must be >= 1, --mu and --sigma-over-mu >= 0")
    if args.batch % args.group:
        parser.error(f"--batch ({args.batch}) must be a multiple of --group ({args.group})")

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 110))
    with console.status("running sync / one_off / async pipelines..."):
        res = run(args.steps, args.turns, args.mu, args.sigma_over_mu, args.batch, args.group,
                  args.max_envs, args.seed)
    table = Table(title=(
        f"async modes: {res['steps']} steps, batch {res['batch_size']} (groups of "
        f"{res['group_size']}), {res['max_envs']} envs, {res['turns']} turns, env latency "
        f"N({res['mu']}, {res['sigma_over_mu']}*mu)"))
    for col in ("mode", "alpha", "step s", "traj/s", "vs row 1", "staleness", "stale ab.",
                "surplus ab.", "dropped", "wall s"):
        table.add_column(col, justify="left" if col in ("mode", "staleness") else "right")
    base = res["rows"][0]["trajectories_per_s"]
    for r in res["rows"]:
        hist = " ".join(f"{k}:{v}" for k, v in r["staleness_hist"].items())
        table.add_row(r["mode"], str(r["alpha"]), f"{r['step_time_s']:.2f}",
                      f"{r['trajectories_per_s']:.1f}", f"{r['trajectories_per_s'] / base:.2f}x",
                      hist, str(r["aborted_stale"]), str(r["aborted_surplus"]),
                      str(r["dropped_during_run"]), f"{r['wall_s']:.1f}")
    console.print(table)
    console.print("staleness: histogram 'versions behind: trajectories'; dropped = lost while "
                  "running (run-end aborts of in-flight work not counted)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        console.print(f"wrote {args.json}")
    return 0
