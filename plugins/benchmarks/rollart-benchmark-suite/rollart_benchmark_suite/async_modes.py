"""``rollart bench async``: the paper's baselines against async, at equal capacity.

Each configuration runs the real pipeline in-process (``build_job(in_process=True)``: the
torch trainer, the torch engine behind the LLMProxy, the environment host and the reward
worker as objects in this process, their blocking calls in threads; the control plane
(RolloutScheduler, SampleBuffer, Pipeline); the ``local`` weight transport). Training and
generation overlap only where torch kernels release the interpreter lock, so the model is
sized for kernels that do (hidden 256, micro-batches of 8). ``--ray`` runs every worker as
a Ray actor instead, as ``rollart train`` does (one process each; slower to start: about a
minute per configuration on a loaded 2-core machine). The task: a multi-turn env (``bench-latency``:
one constrained action word per turn, episodes of ``turns/2..turns`` steps) whose every
step sleeps a latency drawn from N(mu, sigma), truncated at 0 (a slow tool or container).

What is held equal, so that differences come from the protocol alone:

- **capacity**: every configuration has ``--max-envs`` environments. sync and one_off fill
  them with redundancy (``redundancy = max_envs / batch - 1``: that many launches per
  iteration, the surplus aborted once the batch is full); async keeps them busy under its
  admission control;
- **draws**: episode lengths and latencies come from the env seed, and the scheduler
  derives the env seed from the group's launch index (not from an RNG whose call sequence
  depends on the mode): group k is the same episode in every configuration;
- **workload**: the model and batch are sized so that a training step and the rollout of a
  batch take time of the same order (the regime the paper targets); the stage times are
  reported so that this can be checked;
- **statistics**: ``--repeats`` runs per configuration (interleaved, so that drift in
  machine load hits all alike), the median reported, the first step (cold) excluded.

Rows: sync with ``interaction: batched`` (the paper's Sync: every turn waits for the
slowest env), sync (Sync+), one_off, async at alpha 0, 1, 2.

The bound (``bound_trajectories_per_s``, per run; ``bound_speedup`` against the sync row):
no protocol can train trajectories faster than either stage can take them, over the whole
run (``run_trajectories_per_s``: trajectories trained / the run's wall time, its first
step included):

- the environments: ``max_envs`` of them, each trajectory holding one for at least the sum
  of its own drawn latencies (the env reports them: ``env_sleep_s``), so the trained
  trajectories' sleeps fit in ``max_envs x wall``: at most ``max_envs / mean(sleep)``
  trajectories per second (generation, rewards and the env's own work only add to it);
- the trainer: one batch per step, none faster than the fastest training step measured in
  any run of any configuration: at most ``batch / min(train_s)``.

The bound is the smaller of the two. It comes from the latency draws and the stages'
capacities, not from sync's stage times (the old ``sync step / max(rollout, train)`` was
exceeded by async, which never waits for a straggler); a run above it would mean the bound
is wrong, and ``within_bound`` says so per row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollart_benchmark_suite.straggler import latency_config, latency_registry, wide_executor

# (mode, interaction, alpha)
CONFIGS: list[tuple[str, str, int]] = [
    ("sync", "batched", 0), ("sync", "trajectory", 0), ("one_off", "trajectory", 0),
    ("async", "trajectory", 0), ("async", "trajectory", 1), ("async", "trajectory", 2),
]
# Sized so that one training step and one batch's rollout are of the same order on a small
# CPU machine, with work in large kernels (which run outside the interpreter lock).
BENCH_MODEL = {"hidden_size": 256, "num_layers": 2, "num_heads": 4, "intermediate_size": 512}
TRAIN_MICRO_BATCH = 8
TINY_MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


def _step_reader(metrics: list[dict[str, Any]], sleeps: list[float]) -> Any:
    """``build_job``'s ``on_step``: each step's metrics line and its trained episodes'
    drawn env latency."""

    def on_step(rec: Any, m: dict[str, Any]) -> None:
        metrics.append(m)
        sleeps.extend(float(t.info.get("env_sleep_s", 0.0)) for t in rec.batch)

    return on_step


async def _drive(job: Any, steps: int, threads: int) -> tuple[list[Any], float]:
    pool = wide_executor(asyncio.get_running_loop(), threads)  # in-process workers' calls
    t0 = time.perf_counter()
    try:
        records = await job.pipeline.run(steps)
    finally:
        pool.shutdown(wait=False)
    return records, time.perf_counter() - t0


def run_config(mode: str, interaction: str, alpha: int, steps: int, env_options: dict[str, Any],
               turns: int, batch: int, group: int, max_envs: int, seed: int, registry: Any,
               model: dict[str, int] | None = None, in_process: bool = True) -> dict[str, Any]:
    """One configuration, start to end, in its own temporary run directory."""
    from rollart_sdk.config import load_config
    from rollart_sdk.control.metrics import run_rollout_summary
    from rollart_sdk.job import build_job

    rollout = {"batch_size": batch, "group_size": group, "mode": mode, "alpha": alpha,
               "max_envs": max_envs, "interaction": interaction,
               "redundancy": 0.0 if mode == "async" else max_envs / batch - 1,
               "reset_ahead": False}  # the paper's Sync / Sync+: launch after the update
    with tempfile.TemporaryDirectory(prefix=f"rollart-bench-async-{mode}-") as tmp:
        data = latency_config(env_options, turns, tmp, seed, rollout, max_running=max_envs + 8)
        data["model"] = {"tiny": dict(model or BENCH_MODEL)}
        data["trainer"]["options"]["micro_batch_size"] = TRAIN_MICRO_BATCH
        if not in_process:
            data["transport"] = {"name": "ray"}  # the object store, across processes
        cfg, lines = load_config(data=data)
        metrics: list[dict[str, Any]] = []
        sleeps: list[float] = []  # drawn env latency of every trained trajectory
        job = build_job(cfg, lines, in_process=in_process, log=lambda *a: None, registry=registry,
                        on_step=_step_reader(metrics, sleeps))
        try:
            records, wall = asyncio.run(_drive(job, steps, 2 * max_envs + 16))
        finally:
            job.run_dir.close()
            job.close()
        p = job.pipeline
    summary = run_rollout_summary(p)
    warm = records[1:] or records  # the first step includes start-up
    walls = [m["wall_time"] for m in metrics]
    timed = walls[-1] - walls[0] if len(walls) > 1 else wall
    # From each record's own count: the batches of old steps are freed (KEEP_BATCHES).
    per_step = [sum(n for n, _ in r.trained_turns.values()) for r in records]
    trained_warm = sum(per_step[1:]) or sum(per_step)
    return {
        "mode": mode, "interaction": interaction, "alpha": p.alpha, "steps": len(records),
        "step_time_s": timed / max(1, len(warm)),
        "trajectories_per_s": trained_warm / timed if timed > 0 else 0.0,
        "waste": summary["waste"], "waste_tokens": summary["waste_tokens"],
        "length_bias": summary["length_bias"].get("Latency", 1.0),
        "staleness_hist": {str(k): v for k, v in summary["staleness_hist"].items()},
        "spanning_update": summary["spanning_update"],
        "launched": p.scheduler.launched, "trajectories_trained": p.buffer.trained,
        "dropped": dict(p.buffer.dropped),
        "rollout_s": statistics.mean(r.get_batch_wait_s for r in warm),
        "train_s": statistics.mean(r.train_s for r in warm),
        "weight_sync_s": statistics.mean(r.weight_sync_exposed_s for r in warm),
        "wall_s": wall,
        # For the bound: the whole run's throughput, the trained trajectories' drawn env
        # latency, every step's train time.
        "run_trajectories_per_s": sum(per_step) / wall if wall > 0 else 0.0,
        "env_sleep_mean_s": statistics.mean(sleeps) if sleeps else 0.0,
        "train_s_steps": [r.train_s for r in records],
        "max_envs": max_envs, "batch_size": batch,
    }


def apply_bounds(runs: list[dict[str, Any]]) -> float:
    """Each run's throughput bound (module docstring) in place; returns the trainer's
    fastest step, the same for every run."""
    min_train = min(t for r in runs for t in r["train_s_steps"] if t > 0)
    for r in runs:
        env = (r["max_envs"] / r["env_sleep_mean_s"] if r["env_sleep_mean_s"] > 0
               else float("inf"))
        trainer = r["batch_size"] / min_train
        r["env_bound_trajectories_per_s"] = env
        r["trainer_bound_trajectories_per_s"] = trainer
        r["bound_trajectories_per_s"] = min(env, trainer)
        r["within_bound"] = r["run_trajectories_per_s"] <= r["bound_trajectories_per_s"]
    return min_train


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median step time, with the spread of all runs."""
    ordered = sorted(runs, key=lambda r: r["step_time_s"])
    row = dict(ordered[len(ordered) // 2])
    row["step_time_s"] = statistics.median(r["step_time_s"] for r in runs)
    row["trajectories_per_s"] = statistics.median(r["trajectories_per_s"] for r in runs)
    row["step_time_runs_s"] = [round(r["step_time_s"], 4) for r in runs]
    row["run_trajectories_per_s"] = statistics.median(r["run_trajectories_per_s"] for r in runs)
    row["bound_trajectories_per_s"] = statistics.median(r["bound_trajectories_per_s"]
                                                        for r in runs)
    # Every repeat against its own bound (a bound is not a median).
    row["within_bound_runs"] = [r["within_bound"] for r in runs]
    row["run_trajectories_per_s_runs"] = [round(r["run_trajectories_per_s"], 3) for r in runs]
    row["bound_trajectories_per_s_runs"] = [round(r["bound_trajectories_per_s"], 3) for r in runs]
    row["repeats"] = len(runs)
    return row


def run(steps: int = 8, turns: int = 4, mu: float = 0.1, sigma_over_mu: float = 0.5,
        batch: int = 8, group: int = 4, max_envs: int | None = None, seed: int = 0,
        repeats: int = 3, configs: list[tuple[str, str, int]] | None = None,
        tiny: bool = False, in_process: bool = True, log: Any = None) -> dict[str, Any]:
    if batch % group:
        raise ValueError(f"--batch ({batch}) must be a multiple of --group ({group})")
    envs = max_envs or 2 * batch
    if envs % batch:
        raise ValueError(f"--max-envs ({envs}) must be a multiple of --batch ({batch}): sync and "
                         "one_off launch whole batches to fill the same capacity")
    registry = latency_registry()
    opts = {"turns": turns, "min_turns": max(1, turns // 2), "mu": mu, "sigma": sigma_over_mu * mu}
    configs = configs or CONFIGS
    runs: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(configs))}
    try:
        for rep in range(repeats):
            order = range(len(configs)) if rep % 2 == 0 else reversed(range(len(configs)))
            for i in order:
                mode, interaction, alpha = configs[i]
                r = run_config(mode, interaction, alpha, steps, opts, turns, batch, group, envs,
                               seed, registry, TINY_MODEL if tiny else BENCH_MODEL, in_process)
                runs[i].append(r)
                if log is not None:
                    log(f"repeat {rep + 1}/{repeats}: {mode} {interaction} alpha={alpha}: "
                        f"step {r['step_time_s']:.2f} s (rollout {r['rollout_s']:.2f} s, "
                        f"train {r['train_s']:.2f} s), waste {r['waste']:.0%}")
    finally:
        if not in_process:
            import ray

            ray.shutdown()
    min_train = apply_bounds([r for rs in runs.values() for r in rs])
    rows = [_median_row(runs[i]) for i in range(len(configs))]
    base = next((r for r in rows if r["mode"] == "sync" and r["interaction"] == "trajectory"), rows[0])
    for r in rows:
        r["speedup_vs_sync"] = base["step_time_s"] / r["step_time_s"]
        r["run_speedup_vs_sync"] = r["run_trajectories_per_s"] / base["run_trajectories_per_s"]
        r["bound_speedup"] = r["bound_trajectories_per_s"] / base["run_trajectories_per_s"]
    return {"benchmark": "async", "steps": steps, "turns": turns, "mu": mu,
            "sigma_over_mu": sigma_over_mu, "batch_size": batch, "group_size": group,
            "max_envs": envs, "seed": seed, "repeats": repeats, "in_process": in_process,
            "model": TINY_MODEL if tiny else BENCH_MODEL, "min_train_s": min_train,
            "bound_exceeded": [f"{r['mode']} {r['interaction']} alpha={r['alpha']}"
                               for r in rows if not all(r["within_bound_runs"])],
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rollart bench async``; prints a table, optionally writes JSON."""
    parser = argparse.ArgumentParser(prog="rollart bench async",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=8, help="training steps per configuration")
    parser.add_argument("--turns", type=int, default=4, help="longest episode (env steps)")
    parser.add_argument("--mu", type=float, default=0.1, help="mean env step latency (s)")
    parser.add_argument("--sigma-over-mu", type=float, default=0.5, help="latency spread")
    parser.add_argument("--batch", type=int, default=8, help="trajectories per training step")
    parser.add_argument("--group", type=int, default=4, help="GRPO group size")
    parser.add_argument("--max-envs", type=int, default=None,
                        help="environment capacity, same for every configuration (default: 2 * --batch)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true",
                        help="a 1-layer model (smoke tests): training becomes negligible")
    parser.add_argument("--ray", action="store_true",
                        help="every worker as a Ray actor (one process each), as rollart train")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results here")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.turns < 1 or args.mu < 0 or args.sigma_over_mu < 0 or args.repeats < 1:
        parser.error("--steps must be >= 2 (the first is excluded), --turns and --repeats >= 1, "
                     "--mu and --sigma-over-mu >= 0")
    if args.batch % args.group:
        parser.error(f"--batch ({args.batch}) must be a multiple of --group ({args.group})")

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 130))
    if args.ray:
        from rollart_sdk.ray_utils import local_ray_env

        local_ray_env()
    res = run(args.steps, args.turns, args.mu, args.sigma_over_mu, args.batch, args.group,
              args.max_envs, args.seed, args.repeats, tiny=args.tiny, in_process=not args.ray,
              log=lambda line: console.print(line, highlight=False))
    table = Table(title=(
        f"async modes: {res['steps']} steps x {res['repeats']} repeats (median), batch "
        f"{res['batch_size']} (groups of {res['group_size']}), {res['max_envs']} envs in every "
        f"row, episodes of {max(1, res['turns'] // 2)}-{res['turns']} turns, env latency "
        f"N({res['mu']}, {res['sigma_over_mu']}*mu)"))
    for col in ("mode", "alpha", "interaction", "step s", "traj/s", "vs sync", "run traj/s",
                "bound", "waste", "length bias", "staleness", "rollout / train s"):
        table.add_column(col, justify="left" if col in ("mode", "interaction", "staleness") else "right")
    for r in res["rows"]:
        hist = " ".join(f"{k}:{v}" for k, v in r["staleness_hist"].items())
        table.add_row(r["mode"], str(r["alpha"]), r["interaction"], f"{r['step_time_s']:.2f}",
                      f"{r['trajectories_per_s']:.1f}", f"{r['speedup_vs_sync']:.2f}x",
                      f"{r['run_trajectories_per_s']:.1f}",
                      f"{r['bound_trajectories_per_s']:.1f} ({r['bound_speedup']:.2f}x)",
                      f"{r['waste']:.0%}", f"{r['length_bias']:.2f}", hist,
                      f"{r['rollout_s']:.2f} / {r['train_s']:.2f}")
    console.print(table)
    console.print("run traj/s: trajectories trained / the run's wall time; bound: "
                  "min(max_envs / mean drawn env latency of the trained trajectories, batch / "
                  f"fastest train step = {res['min_train_s']:.3f} s), median over repeats "
                  "(x: over sync's run traj/s). staleness: 'engine version at get_batch - "
                  "start version: trajectories'; waste: dropped / decided (run-end aborts "
                  "not counted)")
    if res["bound_exceeded"]:
        console.print(f"[red]a run exceeded its bound (the bound is wrong): "
                      f"{', '.join(res['bound_exceeded'])}[/red]")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        console.print(f"wrote {args.json}")
    return 0
