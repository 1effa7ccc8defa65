"""``rollart bench straggler``: trajectory-level vs batched environment interaction.

Same engine, same environments, same latency draws, two ways to drive them:

- **trajectory**: one real :class:`~rollart_sdk.control.env_manager.EnvManager` per
  environment, each on its own timeline (what the pipeline does): an environment that
  finishes its step asks for its next action at once;
- **batched**: the same EnvManagers joined in one lockstep wave
  (:class:`~rollart_sdk.control.lockstep.TurnBarrier`, what ``rollout.interaction:
  batched`` does in the pipeline): no environment generates turn t before every one has
  finished turn t - 1, so each turn waits for the slowest (the "all envs wait for the
  straggler" baseline of the paper, section 4).

Environment latency ``lat[env][turn]`` is drawn once per sigma/mu from N(mu, sigma),
truncated at 0, seeded, and the very same matrix is replayed by both modes (the latency
env sleeps ``lat[env][turn]`` in ``step``). Environments are hosted by the real
``EnvWorker`` role class and generation is served by the real torch engine
(``EngineWorker``) behind the real ``LLMProxy``, all built by ``build_job(in_process=True)``.

Ideal bounds ignore generation (one constrained action token per turn on a tiny model,
the same small cost per turn in both modes, reported separately as ``generate_s_mean``):

- batched ideal    = sum over turns of (max over envs of lat)
- trajectory ideal = max over envs of (sum over turns of lat)
- ``ideal_speedup`` = batched ideal / trajectory ideal (>= 1 for any draws)
- ``efficiency`` of a mode = its ideal / its measured wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field

ENV_NAME = "bench-latency"
TAG = "Latency"
ACTIONS = ["left", "right"]


# ---------------------------------------------------------------------------- the env
class LatencyOptions(BaseModel):
    """Options of env ``bench-latency`` (registered only by the benchmarks)."""

    model_config = ConfigDict(extra="forbid")

    turns: int = Field(6, ge=1, description="steps per episode (the last one terminates)")
    min_turns: int | None = Field(
        None, ge=1, description="episodes last min_turns..turns steps, drawn from the reset "
                                "seed; None: always turns")
    mu: float = Field(0.1, ge=0, description="mean step latency in seconds")
    sigma: float = Field(0.0, ge=0, description="std of the step latency in seconds")
    latencies: list[list[float]] | None = Field(
        None, description="pre-drawn latencies: reset(seed=s) replays row s % len(latencies)"
    )


class LatencyEnv(gymnasium.Env):
    """A FrozenLake-like text env whose ``step`` takes a given time (a slow tool/container).

    Reward 1 per ``left`` action, so a GRPO group has something to compare. Latencies come
    from the ``latencies`` row picked by the reset seed, or are drawn from N(mu, sigma)
    truncated at 0 with the reset seed (so a GRPO group shares its draws).
    """

    action_vocabulary = ACTIONS
    system_prompt = None

    def __init__(self, turns: int = 6, mu: float = 0.1, sigma: float = 0.0,
                 latencies: list[list[float]] | None = None, min_turns: int | None = None) -> None:
        if min_turns is not None and min_turns > turns:
            raise ValueError(f"min_turns ({min_turns}) must be <= turns ({turns})")
        self.turns = turns
        self.min_turns = min_turns
        self.mu, self.sigma = mu, sigma
        self.latencies = latencies
        self.observation_space = spaces.Text(max_length=64, min_length=1)
        self.action_space = spaces.Text(max_length=64, min_length=0)
        self._row: list[float] = []
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        s = seed or 0
        if self.latencies:
            self._row = list(self.latencies[s % len(self.latencies)])
        else:
            rng = random.Random(s)
            self._row = [max(0.0, rng.gauss(self.mu, self.sigma)) for _ in range(self.turns)]
        if len(self._row) < self.turns:
            raise ValueError(f"latency row {s % len(self.latencies or [0])} has {len(self._row)} "
                             f"entries, fewer than turns={self.turns}; draw turns entries per env")
        self._t = 0
        self._n = (self.turns if self.min_turns is None
                   else random.Random(f"turns/{s}").randint(self.min_turns, self.turns))
        return "go", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep(self._row[self._t])
        self._t += 1
        done = self._t >= self._n
        # env_sleep_s: the episode's drawn latency so far (the async bench's env bound)
        return f"t{self._t}", float(action.strip() == "left"), done, False, {
            "success": done, "env_sleep_s": sum(self._row[:self._t])}


def latency_registry() -> Any:
    """The installed plugins plus env ``bench-latency`` (defined in this module)."""
    from rollart_sdk.hookspecs import hookimpl
    from rollart_sdk.plugins import load_plugins

    def rollart_register_envs(registry: Any) -> None:
        registry.register(ENV_NAME, factory=f"{__name__}:LatencyEnv",
                          options=f"{__name__}:LatencyOptions",
                          summary="benchmark env: step sleeps a given latency")

    plugin = SimpleNamespace(rollart_register_envs=hookimpl(rollart_register_envs))
    return load_plugins(extra={"rollart-bench-latency": plugin}).registry


def latency_config(env_options: dict[str, Any], turns: int, output_dir: str, seed: int = 0,
                   rollout: dict[str, Any] | None = None, max_running: int = 64) -> dict[str, Any]:
    """A run config: one latency task, a tiny model, the torch engine and trainer."""
    return {
        "name": "bench",
        "seed": seed,
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                           "intermediate_size": 64}},
        "tasks": [{
            "tag": TAG,
            "env": {"name": ENV_NAME, "options": env_options},
            "reward": {"name": "rule", "options": {"mode": "env_return"}},
            "max_turns": turns,
            "constrain_actions": True,
            "system_prompt": None,
            "sampling": {"temperature": 1.0},
            "step_timeout_s": 120.0,
        }],
        "engine": {"name": "torch", "options": {"max_running": max_running}},
        "trainer": {"name": "torch", "options": {"lr": 0.003, "micro_batch_size": 16}},
        "transport": {"name": "local"},
        "rollout": rollout or {"batch_size": 4, "group_size": 2, "mode": "sync"},
        "train": {"steps": 1, "bucket_mb": 1},
        "output_dir": output_dir,
    }


def wide_executor(loop: asyncio.AbstractEventLoop, workers: int) -> ThreadPoolExecutor:
    """In-process workers run blocking calls (env steps, engine steps) via
    ``asyncio.to_thread``; the default pool has min(32, cpus + 4) threads, which on a
    small machine would serialise sleeping environments. Give the loop enough threads
    (a Ray EnvWorker gets ``max_concurrency`` the same way)."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench")
    loop.set_default_executor(pool)
    return pool


# ---------------------------------------------------------------------------- the draws
def draw_latencies(envs: int, turns: int, mu: float, sigma: float, seed: int) -> list[list[float]]:
    """lat[env][turn] ~ N(mu, sigma) truncated at 0 (resampled, not clipped, up to 100 tries:
    clipping would pile mass at exactly 0)."""
    rng = random.Random(seed)
    out = []
    for _ in range(envs):
        row = []
        for _ in range(turns):
            x = -1.0
            for _ in range(100):
                x = rng.gauss(mu, sigma)
                if x >= 0:
                    break
            row.append(max(0.0, x))
        out.append(row)
    return out


def ideal_times(lat: list[list[float]]) -> tuple[float, float]:
    """(batched ideal, trajectory ideal): sum_t max_e lat, max_e sum_t lat."""
    turns = len(lat[0])
    batched = sum(max(row[t] for row in lat) for t in range(turns))
    trajectory = max(sum(row) for row in lat)
    return batched, trajectory


# ---------------------------------------------------------------------------- the modes
class _Parts:
    """The control-plane pieces a job built: proxy, env/reward workers, chat, task."""

    def __init__(self, job: Any) -> None:
        sched = job.pipeline.scheduler
        self.proxy = job.pipeline.proxy
        self.chat = sched.chat
        self.task = sched.tasks[TAG]
        self.env = sched.env_workers[0]
        self.reward = sched.reward_worker


async def run_trajectory_mode(parts: _Parts, seeds: list[int], prefix: str,
                              lockstep: bool = False) -> tuple[float, list[float]]:
    """One real EnvManager per env, all at once: each on its own timeline, or (``lockstep``)
    joined in one wave that takes every turn together."""
    from rollart_sdk.control.env_manager import EnvManager
    from rollart_sdk.control.lockstep import TurnBarrier
    from rollart_sdk.types import Trajectory

    wave = TurnBarrier() if lockstep else None
    mgrs = [
        EnvManager(Trajectory(f"{prefix}-{i}", TAG, f"{prefix}-g{i}", 0), seed, seed, parts.task,
                   parts.chat, parts.proxy, parts.env, parts.reward, lambda: 0, barrier=wave)
        for i, seed in enumerate(seeds)
    ]
    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(m.run() for m in mgrs))
    wall = time.perf_counter() - t0
    bad = [t.dropped for t in trajs if t.dropped]
    if bad:
        raise RuntimeError(f"{'batched' if lockstep else 'trajectory'} mode: {len(bad)} "
                           f"trajectories dropped, e.g. {bad[0]}")
    gen = [t1 - t0 for t in trajs for span, t0, t1 in t.timings if span == "generate"]
    return wall, gen


async def run_batched_mode(parts: _Parts, seeds: list[int], prefix: str) -> tuple[float, list[float]]:
    """Lockstep: the pipeline's ``interaction: batched`` (each turn waits for the slowest)."""
    return await run_trajectory_mode(parts, seeds, prefix, lockstep=True)


# ---------------------------------------------------------------------------- driver
def run(envs: int = 16, turns: int = 6, mu: float = 0.15, ratios: tuple[float, ...] = (0.1, 0.5, 1.0),
        seed: int = 0, repeats: int = 2) -> dict[str, Any]:
    """Build one in-process job whose latency env replays every draw, run both modes."""
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job

    draws = {r: draw_latencies(envs, turns, mu, r * mu, seed + int(r * 1000)) for r in ratios}
    # Row block k holds ratio k's matrix; the last block (zeros) is the warm-up.
    rows: list[list[float]] = [row for r in ratios for row in draws[r]] + [[0.0] * turns] * envs
    opts = {"turns": turns, "mu": mu, "sigma": 0.0, "latencies": rows}
    with tempfile.TemporaryDirectory(prefix="rollart-bench-straggler-") as tmp:
        cfg, lines = load_config(data=latency_config(opts, turns, tmp, seed, max_running=envs + 8))
        job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=latency_registry())
        try:
            result = asyncio.run(_run_all(job, envs, ratios, draws, repeats))
        finally:
            job.close()
    result.update(benchmark="straggler", envs=envs, turns=turns, mu=mu, seed=seed, repeats=repeats)
    return result


async def _run_all(job: Any, envs: int, ratios: tuple[float, ...],
                   draws: dict[float, list[list[float]]], repeats: int) -> dict[str, Any]:
    pool = wide_executor(asyncio.get_running_loop(), 2 * envs + 16)
    parts = _Parts(job)
    try:
        warm = [len(ratios) * envs + i for i in range(envs)]
        await run_trajectory_mode(parts, warm, "warm-t")
        await run_batched_mode(parts, warm, "warm-b")
        rows = []
        for k, ratio in enumerate(ratios):
            seeds = [k * envs + i for i in range(envs)]
            traj_walls, batch_walls, gen, phase = [], [], [], []
            for rep in range(repeats):
                # Alternate the order so drift in machine load hits both modes alike.
                order = ("t", "b") if rep % 2 == 0 else ("b", "t")
                for mode in order:
                    if mode == "t":
                        w, g = await run_trajectory_mode(parts, seeds, f"r{k}-{rep}-t")
                        traj_walls.append(w)
                        gen.extend(g)
                    else:
                        w, g = await run_batched_mode(parts, seeds, f"r{k}-{rep}-b")
                        batch_walls.append(w)
                        phase.extend(g)
            b_ideal, t_ideal = ideal_times(draws[ratio])
            tw, bw = min(traj_walls), min(batch_walls)
            rows.append({
                "sigma_over_mu": ratio,
                "trajectory_s": tw,
                "batched_s": bw,
                "speedup": bw / tw,
                "ideal_trajectory_s": t_ideal,
                "ideal_batched_s": b_ideal,
                "ideal_speedup": b_ideal / t_ideal,
                "trajectory_efficiency": t_ideal / tw,
                "batched_efficiency": b_ideal / bw,
                # One generate call (request sent to answer), in each mode.
                "generate_s_mean": sum(gen) / len(gen) if gen else 0.0,
                "batched_generate_s_mean": sum(phase) / len(phase) if phase else 0.0,
                "trajectory_runs_s": traj_walls,
                "batched_runs_s": batch_walls,
            })
        return {"rows": rows}
    finally:
        pool.shutdown(wait=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rollart bench straggler``; prints a table, optionally writes JSON."""
    parser = argparse.ArgumentParser(prog="rollart bench straggler",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--envs", type=int, default=16, help="environments run together")
    parser.add_argument("--turns", type=int, default=6, help="steps per episode")
    parser.add_argument("--mu", type=float, default=0.15, help="mean env step latency (s)")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.1, 0.5, 1.0],
                        metavar="SIGMA_OVER_MU", help="sigma/mu values to measure")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode (best kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results here")
    args = parser.parse_args(argv)
    if args.envs < 1 or args.turns < 1 or args.mu < 0 or args.repeats < 1:
        parser.error("--envs, --turns and --repeats must be >= 1 and --mu >= 0")

    from rich.console import Console
    from rich.table import Table

    console = Console()
    with console.status("running trajectory-level vs batched env interaction..."):
        res = run(args.envs, args.turns, args.mu, tuple(args.ratios), args.seed, args.repeats)
    table = Table(title=(f"straggler: {args.envs} envs x {args.turns} turns, env latency "
                         f"N({args.mu}, sigma) truncated at 0 - same draws in both modes"))
    for col in ("sigma/mu", "batched s (ideal)", "traj s (ideal)", "speedup",
                "ideal speedup", "eff. batched", "eff. traj"):
        table.add_column(col, justify="right")
    for r in res["rows"]:
        table.add_row(f"{r['sigma_over_mu']:.2f}",
                      f"{r['batched_s']:.2f} ({r['ideal_batched_s']:.2f})",
                      f"{r['trajectory_s']:.2f} ({r['ideal_trajectory_s']:.2f})",
                      f"{r['speedup']:.2f}x", f"{r['ideal_speedup']:.2f}x",
                      f"{r['batched_efficiency']:.0%}", f"{r['trajectory_efficiency']:.0%}")
    console.print(table)
    gen = sum(r["generate_s_mean"] for r in res["rows"]) / len(res["rows"])
    phase = sum(r["batched_generate_s_mean"] for r in res["rows"]) / len(res["rows"])
    console.print(f"paper: 1.23x (sigma/mu 0.1) to 2.27x (sigma/mu 1.0). Ideal bounds ignore "
                  f"generation: {gen * 1e3:.1f} ms per generate call (trajectory mode), "
                  f"{phase * 1e3:.1f} ms per generate call (batched, a turn's calls reach the engine together).")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        console.print(f"wrote {args.json}")
    return 0
