"""``rollart bench small``: the small-workload speed benchmark (issue 12), end to end.

The workload (any trainer can run it; docs/benchmarks.md spells it out):

- env: FrozenLake 4x4, gymnasium's default map (``SFFF/FHFH/FFFH/HFFG``), not slippery,
  observation ``obs_format: compact`` (``pos=r,c goal=r,c holes=...``), at most 8 turns,
  sampling constrained to the four action tokens (``Left Down Right Up``), temperature 1;
  reward 1 when the goal is reached, else 0 (rule reward ``mode: success``);
- model: a Llama trained from scratch, hidden 128, 2 layers, 4 heads, MLP 256, seed 0,
  the local character tokenizer plus the four action words as single tokens (0.36M
  parameters), no system prompt, the tokenizer's chat template;
- GRPO: 8 groups of 8 episodes (one env seed per group) per step, lr 5e-4 (1e-3 until 5
  Dec 2026: since the trained policy is the sampled one, over the four allowed tokens, a
  step at 1e-3 moves it so far that sync collapsed on seed 0), AdamW, token-level (DAPO)
  loss, group-normalised advantages, grad-norm clip 1; the reference and TRL take the
  same lr from this config;
- target: the success rate averaged over the last 5 steps reaches 0.7. A step's success
  rate is over every episode that ended since the step before (``success_finished/<tag>``,
  trained or not), as TRL's is over all its episodes. In sync mode that is the batch's;
  in async mode the batch is the groups that completed first, more of the short
  episodes, and its ``success/<tag>`` can differ (until 6 Dec 2026 the rule read it: the
  row's ``success_batch_per_step``). Reported:
  ``time_to_target_s`` from the command (process start, imports and start-up included) and
  after start-up, ``steps_to_target``, ``episodes_per_s`` (trained episodes / wall time
  after start-up);
- variants: env latency none or N(0.05, 0.02) s per env step (truncated at 0, drawn per
  env and turn from the reset seed), mode ``sync`` or ``async`` alpha 1; each repeated
  with seeds 0..R-1 (``--repeats``), the table shows the median.

Every run is a fresh ``python`` process (as a user's command would be) running the real
pipeline. ``--layout inprocess`` (default; the small-machine layout, engine and trainer
colocated as in verl's hybrid engine): ``build_job(in_process=True)`` - the torch engine
behind the LLMProxy, the torch trainer, the ``local`` transport (the weight swap is an
in-memory copy), RolloutScheduler and SampleBuffer in one process. ``--layout ray``: the
same on a local Ray, one process per role (trainer, engine), the ``ray`` transport,
threads per role from the thread plan. Environments live in the EnvManagers' process:
called on its event loop (``env_host: inline``) when they have no latency, on its threads
(``env_host: thread``: the sleeps off the event loop, no process per env) when they
sleep. A run stops when it reaches the target or ``--max-steps``. A seed *collapses*
when its success rate over its last 5 steps is 0 after having been above 0.3.

That is ``--path job`` (the default). ``--path train`` runs each variant as a user does,
``rollart train CONFIG`` as a subprocess with the CLI's own layout choice, stopped by
SIGTERM at the target (:mod:`rollart_benchmark_suite.small_train`). Env ``bench-frozenlake`` is
registered by the built-in benchmarks plugin, so both paths find the same env.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENV_NAME = "bench-frozenlake"
_MODULE = "rollart_benchmark_suite.small"
TAG = "FrozenLake"
TARGET = 0.7
WINDOW = 5
REFERENCE = {  # the synchronous single-process reference (TRL GRPOTrainer, lr 1e-3)
    "none": {"time_to_target_s": 18.7, "after_startup_s": 12.8, "steps": 27, "episodes_per_s": 119},
    "normal": {"time_to_target_s": 42.2, "after_startup_s": 36.8, "steps": 27, "episodes_per_s": 48.7},
}
LATENCY = {"none": (0.0, 0.0), "normal": (0.05, 0.02)}


def __getattr__(name: str) -> Any:
    """``LatencyFrozenLake`` lives in :mod:`rollart_benchmark_suite.latency_env` (importing it
    imports the frozenlake plugin and gymnasium; this module stays light)."""
    if name == "LatencyFrozenLake":
        from rollart_benchmark_suite.latency_env import LatencyFrozenLake

        return LatencyFrozenLake
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class LatencyFrozenLakeOptions(BaseModel):
    """Options of env ``bench-frozenlake``: the latency, plus any ``frozenlake`` option."""

    model_config = ConfigDict(extra="allow")
    mu: float = Field(0.0, ge=0, description="mean env step latency (s)")
    sigma: float = Field(0.0, ge=0, description="its standard deviation (s)")
    reset_s: float = Field(0.0, ge=0, description=(
        "seconds each reset sleeps (an env whose start waits: a container, a page load)"))

    @model_validator(mode="after")
    def _frozenlake_options(self) -> LatencyFrozenLakeOptions:
        """The other keys are ``frozenlake``'s: checked by its options (an unknown key
        fails here, at ``validate``, not when the env is built)."""
        from rollart_env_frozenlake.env import FrozenLakeOptions

        FrozenLakeOptions(**(self.model_extra or {}))
        return self


def _registry() -> Any:
    """The installed plugins: env ``bench-frozenlake`` is registered by this package's
    entry point (:mod:`rollart_benchmark_suite.plugin`), so that ``rollart train`` finds it
    too (``--path train``) and both paths build the same env class."""
    from rollart_sdk.plugins import load_plugins

    return load_plugins().registry


TINY = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "intermediate_size": 256,
        "seed": 0}
MODEL_ENV = "ROLLART_BENCH_SMALL_MODEL"  # the checkpoint the parent built for every run
TARGET_ENV = "ROLLART_BENCH_SMALL_TARGET"  # --target, for the run's own stop


def build_model(cache_dir: str) -> str:
    """The workload's model (``TINY``, the FrozenLake action words as single tokens) as a
    checkpoint folder under ``cache_dir``: built once per benchmark command, loaded by
    every run (as the reference's runs load theirs)."""
    from rollart_env_frozenlake.env import ACTIONS

    from rollart_sdk.config import ModelConfig
    from rollart_sdk.models import prepare_model

    built = prepare_model(ModelConfig(tiny=TINY), cache_dir, sorted(ACTIONS))
    assert built.path is not None
    return built.path


def workload_config(mode: str, latency: str, seed: int, output_dir: str,
                    max_steps: int, layout: str = "inprocess") -> dict[str, Any]:
    """The run config of one variant (what ``rollart train`` would be given). The model is
    ``TINY``, or the folder ``ROLLART_BENCH_SMALL_MODEL`` names (the same model, built)."""
    mu, sigma = LATENCY[latency]
    built = os.environ.get(MODEL_ENV)
    return {
        "name": f"small-{mode}-{latency}-{seed}",
        "seed": seed,
        "model": {"path": built} if built else {"tiny": dict(TINY)},
        "tasks": [{
            "tag": TAG,
            "env": {"name": ENV_NAME, "options": {
                "map_name": "4x4", "is_slippery": False, "obs_format": "compact",
                "mu": mu, "sigma": sigma}},
            "reward": {"name": "rule", "options": {"mode": "success"}},
            "max_turns": 8,
            "constrain_actions": True,
            "system_prompt": None,
            "sampling": {"temperature": 1.0},
            # Sleeping envs wait on the run's threads (no process per env, the loop runs on).
            "env_host": "inline" if mu == 0 else "thread",
        }],
        "engine": {"name": "torch", "options": {"max_running": 64, "max_seq_len": 512}},
        "trainer": {"name": "torch", "options": {"lr": 5e-4, "micro_batch_size": 64,
                                                 "micro_batch_tokens": 16384,
                                                 "seed": seed}},
        "transport": {"name": "local" if layout == "inprocess" else "ray"},
        "rollout": {"batch_size": 64, "group_size": 8, "mode": mode, "alpha": 1},
        "train": {"steps": max_steps, "bucket_mb": 4, "save_final_model": False},
        "output_dir": output_dir,
    }


REFERENCE_KEY = "trainer.options.updates_per_batch"  # the one --set the reference takes
TRL_VERSION = "1.16.0"  # the TRL release --modes trl was written and measured against
TRL_MISSING = (
    f"rollart bench small --modes trl runs Hugging Face TRL's GRPOTrainer, and this Python "
    f"({sys.executable}) has no `trl`. It is not a rollart dependency: install it next to "
    f"rollart in a venv of its own (from the rollart-sdk checkout), then run the bench "
    f"from there:\n"
    f"  python3 -m venv --system-site-packages /tmp/trl-venv\n"
    f"  /tmp/trl-venv/bin/pip install -c constraints.txt trl=={TRL_VERSION}\n"
    f"  /tmp/trl-venv/bin/python -m rollart_sdk.cli bench small --modes trl")
REFERENCE_MODES = ("reference", "trl")  # single-process trainers: they take REFERENCE_KEY only


def reference_updates(overrides: list[str] | None) -> int:
    """The reference's updates per batch from ``--set``: it takes ``trainer.options.
    updates_per_batch`` (TRL's num_iterations) and ignores rollart's other keys (they
    describe rollart's system, not the algorithm both run)."""
    updates = 1
    for item in overrides or []:
        key, _, value = item.partition("=")
        if key.strip() == REFERENCE_KEY:
            updates = int(value)
    return updates


# ---------------------------------------------------------------------------- one run
def child(mode: str, latency: str, seed: int, max_steps: int, out: str,
          layout: str = "inprocess", overrides: list[str] | None = None) -> None:
    """One run from this process; writes its figures as JSON to ``out``. ``overrides``:
    dotted ``key=value`` changes to the workload's config (``rollart train``'s syntax)."""
    if mode == "reference":  # the synchronous single-process GRPO trainer (small_reference)
        from rollart_benchmark_suite.small_reference import reference_child

        updates = reference_updates(overrides)
        Path(out).write_text(json.dumps(reference_child(latency, seed, max_steps, out,
                                                        updates)))
        return
    if mode == "trl":  # Hugging Face TRL's real GRPOTrainer on the workload (small_trl)
        if importlib.util.find_spec("trl") is None:
            raise SystemExit(TRL_MISSING)
        from rollart_benchmark_suite.small_trl import trl_child

        Path(out).write_text(json.dumps(trl_child(latency, seed, max_steps, out,
                                                  reference_updates(overrides))))
        return
    t_start = time.time()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job

    registry = _registry()
    with tempfile.TemporaryDirectory(prefix="rollart-bench-small-") as tmp:
        cfg, lines = load_config(data=workload_config(mode, latency, seed, tmp, max_steps,
                                                      layout), overrides=overrides)
        metrics: list[dict[str, Any]] = []
        reached = asyncio.Event()  # the success target held over the last WINDOW steps
        job = build_job(cfg, lines, in_process=layout == "inprocess", log=lambda *a: None,
                        registry=registry, on_step=_step_reader(metrics, reached))
        t_ready = time.time()
        cpu_ready = time.process_time()
        try:
            asyncio.run(_drive(job, max_steps, reached))
            (engine,) = job.pipeline.proxy.workers.values()
            stats = job.spawner.call(engine, "stats", timeout=60)
        finally:
            job.run_dir.close()
            job.close()
            if layout == "ray":
                import ray

                ray.shutdown()  # this process's own local Ray (never `ray stop`)
    Path(out).write_text(json.dumps({"t_start": t_start, "t_ready": t_ready, "metrics": metrics,
                                     "cpu_ready": cpu_ready, "engine": stats,
                                     "concurrency": job.pipeline.scheduler.max_running}))


def _step_reader(metrics: list[dict[str, Any]], reached: asyncio.Event) -> Any:
    """``build_job``'s ``on_step``: each step's metrics line with its time, CPU and
    latency figures; ``reached`` is set once the success target held over ``WINDOW``."""
    target = float(os.environ.get(TARGET_ENV, TARGET))

    def on_step(rec: Any, m: dict[str, Any]) -> None:
        m["t"] = time.time()
        m["cpu"] = time.process_time()  # CPU seconds of this process (all its threads)
        m["train_tokens"] = rec.train_metrics.get("tokens", 0.0)
        m.update(latency_figures(rec.batch))
        metrics.append(m)
        succ = [step_success(x) for x in metrics[-WINDOW:]]
        if len(succ) == WINDOW and sum(succ) / WINDOW >= target:
            reached.set()

    return on_step


async def _drive(job: Any, max_steps: int, reached: asyncio.Event) -> None:
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=job.pipeline.scheduler.max_running + 16)
    loop.set_default_executor(pool)
    run = asyncio.create_task(job.pipeline.run(max_steps))
    stop = asyncio.create_task(reached.wait())
    await asyncio.wait([run, stop], return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if not run.done():
        run.cancel()
    try:
        await run
    except asyncio.CancelledError:
        pass
    pool.shutdown(wait=False)


def latency_figures(batch: list[Any]) -> dict[str, float]:
    """A step's env latency, from its trained episodes' ``env_sleep_s``: the slowest
    episode's sleeps (a sync step cannot end sooner: its batch waits for every member, and
    an episode's turns run one after another) and the sum over the batch."""
    sleeps = [float(t.info.get("env_sleep_s", 0.0)) for t in batch]
    return {"slowest_episode_sleep_s": max(sleeps, default=0.0),
            "episode_sleep_s_sum": sum(sleeps)}


def latency_floor(mode: str, metrics: list[dict[str, Any]], concurrency: int) -> float | None:
    """The least rollout time these steps could have taken, given their env latencies:
    sync, the sum over steps of the slowest episode's sleeps (``slowest_episode_sleep_s``;
    the reference's lockstep rollout reports its own per-turn maxima under the same key);
    async, every trained episode's sleeps spread over ``concurrency`` environments at once
    (a looser floor: aborted episodes slept too). No compute, no overhead counted."""
    if not metrics or "slowest_episode_sleep_s" not in metrics[0]:
        return None
    if mode == "async":
        return sum(m["episode_sleep_s_sum"] for m in metrics) / max(1, concurrency)
    return sum(m["slowest_episode_sleep_s"] for m in metrics)


def step_success(line: dict[str, Any]) -> float:
    """A step's success rate for the target rule: over every episode that ended since the
    step before (``success_finished/<tag>``); the batch's where a line has no such figure
    (the single-process references and TRL, whose batch is every episode)."""
    return float(line.get(f"success_finished/{TAG}", line.get(f"success/{TAG}", 0.0)))


def summarize(mode: str, latency: str, seed: int, t_cmd: float, data: dict[str, Any],
              target: float = TARGET) -> dict[str, Any]:
    """A run's row from its step metrics (``data``: ``metrics``, ``t_ready``, and where the
    run's own process measured them, ``t_start``, ``cpu_ready`` and the CPU seconds per
    step; None when it could not, as on ``--path train``)."""
    m = data["metrics"]
    succ = [step_success(x) for x in m]
    hit = None
    for i in range(WINDOW - 1, len(succ)):
        if sum(succ[i - WINDOW + 1 : i + 1]) / WINDOW >= target:
            hit = i
            break
    t_ready = data["t_ready"]
    end = m[hit]["t"] if hit is not None else (m[-1]["t"] if m else t_ready)
    episodes = sum(x.get(f"count/{TAG}", 0) for x in m[: (hit + 1) if hit is not None else None])
    # Exploration luck: a uniform policy reaches the goal in 0.29 % of episodes (17 % of
    # 64-episode steps hold one), and until one does every advantage is 0.
    first = next((i + 1 for i, x in enumerate(succ) if x > 0), None)
    last = succ[-WINDOW:]
    peak = max(succ) if succ else 0.0
    n = max(1, len(m))
    upto = m[: hit + 1] if hit is not None else m
    floor = latency_floor(mode, upto, int(data.get("concurrency", 64)))
    return {
        "mode": mode, "alpha": 1 if mode == "async" else 0, "latency": latency, "seed": seed,
        "reached": hit is not None,
        "time_to_target_s": round(end - t_cmd, 2) if hit is not None else None,
        "time_to_target_after_startup_s": round(end - t_ready, 2) if hit is not None else None,
        "steps_to_target": hit + 1 if hit is not None else None,
        "episodes_per_s": round(episodes / max(end - t_ready, 1e-9), 1),
        "startup_s": round(t_ready - t_cmd, 2),
        # CPU seconds the run used until the target (start-up included): on a machine
        # shared with other work, wall time >= this / cores, whatever the contention.
        "cpu_s_to_target": _rounded(m[hit].get("cpu") if hit is not None else None),
        "cpu_s_startup": _rounded(data.get("cpu_ready")),
        "startup_in_process_s": (_rounded(t_ready - data["t_start"])
                                 if data.get("t_start") is not None else None),
        "first_success_step": first,
        "steps": len(m),
        "success_per_step": [round(x, 4) for x in succ],
        # The batch's (what was trained): the same in sync, short episodes first in async.
        "success_batch_per_step": [round(x.get(f"success/{TAG}", 0.0), 4) for x in m],
        "trained_to_target": episodes if hit is not None else None,
        "final_success_5": round(sum(last) / max(1, len(last)), 3),
        "collapsed": bool(peak > 0.3 and last and max(last) == 0.0),
        "step_s_mean": round((end - t_ready) / max(1, (hit + 1) if hit is not None else len(m)), 3),
        "get_batch_wait_s_mean": round(sum(x["time/get_batch_wait"] for x in m) / n, 3),
        "train_s_mean": round(sum(x["time/train"] for x in m) / n, 3),
        "weight_sync_s_mean": round(sum(x["time/weight_sync"] for x in m) / n, 4),
        "train_tokens_mean": round(sum(x["train_tokens"] for x in m) / n, 1),
        "turns_mean": round(sum(x.get(f"turns/{TAG}", 0) for x in m) / n, 2),
        "aborted_stale": sum(x["trajectories/aborted_stale"] for x in m),
        # The env latency alone, up to the target (or the last step): no run of this mode
        # could take less time after start-up (latency_floor says how it is computed).
        "latency_floor_s": round(floor, 2) if floor is not None else None,
        "latency_floor_s_per_step": (round(floor / max(1, len(upto)), 3)
                                     if floor is not None else None),
        "engine": data.get("engine", {}),
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def run_one(mode: str, latency: str, seed: int, max_steps: int,
            layout: str = "inprocess", overrides: list[str] | None = None,
            model_path: str | None = None, target: float = TARGET) -> dict[str, Any]:
    """One run in a fresh ``python`` process; ``model_path``: the workload's model, built
    (:func:`build_model`; None: the run builds it)."""
    with tempfile.TemporaryDirectory(prefix="rollart-bench-small-out-") as tmp:
        out = str(Path(tmp) / "run.json")
        t_cmd = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "rollart_benchmark_suite.small", "--child", mode, latency,
             str(seed), str(max_steps), out, layout, *(overrides or [])],
            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                 TARGET_ENV: str(target),
                 **({MODEL_ENV: model_path} if model_path else {})},
            capture_output=True, text=True, timeout=1800,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"run {mode}/{latency}/seed {seed} failed:\n{proc.stderr[-3000:]}")
        data = json.loads(Path(out).read_text())
    return {**summarize(mode, latency, seed, t_cmd, data, target), "layout": layout,
            "overrides": list(overrides or [])}


def median_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["mode"], r["latency"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for mode, latency in keys:
        rs = [r for r in rows if r["mode"] == mode and r["latency"] == latency]

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float | None:
            vals = [r[key] for r in rs if r[key] is not None]
            return round(statistics.median(vals), 2) if vals else None

        out.append({"mode": mode, "latency": latency, "runs": len(rs),
                    "reached": sum(r["reached"] for r in rs), "collapsed": sum(r["collapsed"] for r in rs),
                    **{k: med(k) for k in ("time_to_target_s", "time_to_target_after_startup_s",
                                            "steps_to_target", "first_success_step",
                                            "cpu_s_to_target", "episodes_per_s", "startup_s",
                                            "step_s_mean", "get_batch_wait_s_mean",
                                            "train_s_mean", "weight_sync_s_mean",
                                            "latency_floor_s")},
                    "reference_s": REFERENCE[latency]["time_to_target_s"]})
    return out


def check_trl() -> str:
    """The installed TRL's version, before any run (a missing TRL is a setup error with the
    way to install it, not a failed run)."""
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(TRL_MISSING)
    from importlib.metadata import version

    installed = version("trl")
    if installed != TRL_VERSION:
        print(f"note: trl {installed} installed; --modes trl was written against "
              f"{TRL_VERSION} (its GRPOTrainer's rollout_func and env_mask)", flush=True)
    return installed


def _run_variant(args: argparse.Namespace, mode: str, latency: str, seed: int,
                 model_path: str) -> dict[str, Any]:
    """One row: through ``rollart train`` (``--path train``) or ``build_job`` (``job``)."""
    if args.path == "train":
        from rollart_benchmark_suite.small_train import run_train

        return run_train(mode, latency, seed, args.max_steps, args.layout, args.overrides,
                         model_path, target=args.target)
    overrides = (args.overrides if mode not in REFERENCE_MODES else
                 [o for o in args.overrides if o.startswith(REFERENCE_KEY + "=")])
    return {**run_one(mode, latency, seed, args.max_steps, args.layout or "inprocess",
                      overrides, model_path, target=args.target), "path": "job"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        mode, latency, seed_arg, steps, out, layout = argv[1:7]
        child(mode, latency, int(seed_arg), int(steps), out, layout, argv[7:])
        return 0
    parser = argparse.ArgumentParser(prog="rollart bench small",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=["sync", "async"],
                        choices=["sync", "async", "reference", "trl"],
                        help="reference: the synchronous single-process GRPO trainer of "
                             "rollart_benchmark_suite/small_reference.py (TRL's loop in plain "
                             "torch); trl: Hugging Face TRL's own GRPOTrainer on the same "
                             f"workload (rollart_benchmark_suite/small_trl.py; needs trl=="
                             f"{TRL_VERSION} installed, not a rollart dependency)")
    parser.add_argument("--latency", nargs="+", default=["none", "normal"], choices=list(LATENCY))
    parser.add_argument("--repeats", type=int, default=3, help="seeds 0..N-1 per variant")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="explicit seeds")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--path", choices=["job", "train"], default="job",
                        help="job: each run drives build_job() in a child process of the "
                             "bench; train: each run is `rollart train CONFIG` (a YAML file), "
                             "stopped by SIGTERM at the target (rollart_benchmark_suite/"
                             "small_train.py)")
    parser.add_argument("--layout", choices=["inprocess", "ray"], default=None,
                        help="one process (engine and trainer colocated) or one Ray "
                             "process per role; default: inprocess on --path job, the "
                             "config's layout: auto on --path train")
    parser.add_argument("--target", type=float, default=TARGET,
                        help=f"success over the last {WINDOW} steps that ends a run "
                             f"(default {TARGET}, the workload's; lower only for tests)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results here")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        dest="overrides",
                        help="change the workload's rollart config (dotted keys, as "
                             "`rollart train` takes them; e.g. rollout.redundancy=0.25); "
                             "repeatable; recorded in each row. Not the workload any more: "
                             "for experiments")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of each run's process (ROLLART_TORCH_THREADS; "
                             "default: the environment's, else 1)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        os.environ["ROLLART_TORCH_THREADS"] = str(args.threads)
    seeds = args.seeds if args.seeds is not None else list(range(args.repeats))
    if args.path == "train" and set(args.modes) & set(REFERENCE_MODES):
        parser.error("--path train runs `rollart train`: --modes sync and/or async only")
    trl_version = check_trl() if "trl" in args.modes else None
    if args.overrides:  # a bad key or value: the config's own error, before any run starts
        from rollart_sdk.config import load_config

        for mode in set(args.modes) - set(REFERENCE_MODES):
            load_config(data=workload_config(mode, args.latency[0], seeds[0], "/unused",
                                             args.max_steps, args.layout or "inprocess"),
                        overrides=args.overrides)
    # The model is built once, before any run (each run loads it: start-up figures are a
    # loaded checkpoint's, as the reference's are).
    model_dir = tempfile.TemporaryDirectory(prefix="rollart-bench-small-model-")
    model_path = build_model(model_dir.name)
    load_before = os.getloadavg()
    t0 = time.time()
    rows = []
    for latency in args.latency:
        for seed in seeds:
            for mode in args.modes:
                r = _run_variant(args, mode, latency, seed, model_path)
                rows.append(r)
                r["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                print(f"{mode:5s} latency={latency:6s} seed={seed}: "
                      f"target {'at step ' + str(r['steps_to_target']) if r['reached'] else 'not reached'}"
                      f" (first success at step {r['first_success_step']})"
                      f", {r['time_to_target_s']} s from the command ({r['cpu_s_to_target']} CPU-s)"
                      f", start-up {r['startup_s']} s, "
                      f"{r['episodes_per_s']} episodes/s, step {r['step_s_mean']} s "
                      f"(train {r['train_s_mean']} s), latency floor {r['latency_floor_s']} s"
                      f", final success {r['final_success_5']}"
                      f"{' COLLAPSED' if r['collapsed'] else ''}"
                      + (f"; layout {r['layout']}, ended by {r['ended_by']} (exit code "
                         f"{r['exit_code']}, {r['exit_s']} s after SIGTERM)"
                         if r.get("path") == "train" else ""), flush=True)
    table = median_rows(rows)
    print("\nmedian per variant (reference: TRL GRPOTrainer, figures from issue 12):")
    print(f"{'mode':6s} {'latency':8s} {'to 0.7 s':>9s} {'after start':>11s} {'steps':>6s} "
          f"{'ep/s':>6s} {'start s':>8s} {'ref s':>6s} {'reached':>8s} {'collapsed':>9s}")
    for t in table:
        print(f"{t['mode']:6s} {t['latency']:8s} {t['time_to_target_s']!s:>9s} "
              f"{t['time_to_target_after_startup_s']!s:>11s} {t['steps_to_target']!s:>6s} "
              f"{t['episodes_per_s']!s:>6s} {t['startup_s']!s:>8s} {t['reference_s']!s:>6s} "
              f"{t['reached']}/{t['runs']:<6d} {t['collapsed']:>9d}")
    collapsed = [(r["mode"], r["latency"], r["seed"]) for r in rows if r["collapsed"]]
    print(f"\nper seed: {len(rows) - len(collapsed)} of {len(rows)} runs did not collapse"
          + (f"; collapsed: {collapsed}" if collapsed else ""))
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}; "
          f"{os.cpu_count()} cores; {time.time() - t0:.0f} s in all")
    model_dir.cleanup()
    if args.json:
        Path(args.json).write_text(json.dumps({
            "benchmark": "small", "target": args.target, "window": WINDOW, "reference": REFERENCE,
            # --path train: rollart train's thread plan per worker (each row's
            # torch_threads) unless ROLLART_TORCH_THREADS overrides it
            "threads": os.environ.get("ROLLART_TORCH_THREADS")
            or ("1" if args.path == "job" else "plan"), "path": args.path,
            "layout": args.layout or ("inprocess" if args.path == "job" else "auto"),
            "cores": os.cpu_count(), "trl_version": trl_version, "loadavg_before": load_before, "loadavg_after": load_after,
            "wall_s": round(time.time() - t0, 1), "collapsed": collapsed,
            "rows": rows, "median": table}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
