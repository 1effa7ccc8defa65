"""``rollart bench soak``: the quickstart loop for a fixed time under injected faults, and
whether the driver's memory stays flat.

The run is the real one (``build_job`` + ``run_job``: Ray workers, the torch engine and
trainer, the envs in their own processes) with every task's env under
``tasks[].env.faults`` (default: 10 % reset errors, 5 % step errors, 1 % steps that hang
for an hour and are killed at ``step_timeout_s``). ``train.steps`` is set out of reach and
the run is stopped after ``--minutes`` like a Ctrl-C (final checkpoint, summary).

A thread samples the driver's resident memory (``VmRSS`` of this process: the control
plane, the run directory's writers, Ray's client side) every ``--sample-s`` seconds with
the steps done. Reported: RSS at the end of the warm-up (``--warmup`` of the time), at the
end (median of the last 3 samples), the growth in per cent between them (the target:
under 10 %), the least-squares slope after warm-up in MiB per hour, and the run's
accounting (launched, trained, dropped by reason).

``--kill-engine-every MIN`` also SIGKILLs one engine worker's process every MIN minutes
(the engines take turns): Ray restarts it and EngineRecovery reloads it
(docs/failures.md, "Engine worker death"); the kills and ``engine_recovery`` are reported.

``--baseline`` runs the same loop for the same time without faults first: the growth the
faults add is the difference. What it does not show: memory of the worker processes
(engines, trainer, envs: each is its own process, restarted envs start fresh), and leaks
slower than the run's length can resolve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rollart_benchmark_suite import EXAMPLES
from rollart_sdk.ray_utils import actor_pids

DEFAULT_FAULTS = {"reset_error": 0.1, "step_error": 0.05, "hang": 0.01, "hang_s": 3600}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def kill_engines(stop: threading.Event, every_s: float, t0: float,
                 kills: list[tuple[float, int]]) -> None:
    """SIGKILL one engine worker's process every ``every_s`` (they take turns) until
    ``stop``; each kill is appended to ``kills`` as (seconds since ``t0``, PID)."""
    n = 0
    while not stop.wait(every_s):
        pids = actor_pids("EngineWorker")
        if pids:
            victim = pids[n % len(pids)]
            os.kill(victim, signal.SIGKILL)
            kills.append((round(time.monotonic() - t0, 1), victim))
            n += 1


def soak(config: str, minutes: float, faults: dict[str, Any] | None, warmup: float,
         sample_s: float, out_dir: str, overrides: list[str],
         kill_engine_every: float | None = None) -> dict[str, Any]:
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job

    cfg, lines = load_config(config, [f"output_dir={out_dir}", "train.steps=1000000",
                                      "train.save_final_model=false", *overrides])
    extra = []
    for i in range(len(cfg.tasks)):
        extra.append(f"tasks.{i}.env.faults={json.dumps(faults)}" if faults else
                     f"tasks.{i}.env.faults=null")
        extra.append(f"tasks.{i}.step_timeout_s=5")
        extra.append(f"tasks.{i}.reset_timeout_s=10")
    cfg, lines = load_config(config, [f"output_dir={out_dir}", "train.steps=1000000",
                                      "train.save_final_model=false", *extra, *overrides])
    job = build_job(cfg, lines, log=lambda *a: None)
    samples: list[tuple[float, float, int]] = []  # (seconds, RSS MiB, steps done)
    stop = threading.Event()
    t0 = time.monotonic()

    def sampler() -> None:
        while not stop.wait(sample_s):
            samples.append((time.monotonic() - t0, rss_mib(), len(job.pipeline.records)))
        samples.append((time.monotonic() - t0, rss_mib(), len(job.pipeline.records)))

    def stopper() -> None:
        if not stop.wait(minutes * 60):
            signal.raise_signal(signal.SIGINT)  # ends the run like Ctrl-C

    kills: list[tuple[float, int]] = []  # (seconds, PID) of each engine process killed
    threads = [threading.Thread(target=sampler, daemon=True),
               threading.Thread(target=stopper, daemon=True)]
    if kill_engine_every:
        threads.append(threading.Thread(target=kill_engines, daemon=True,
                                        args=(stop, kill_engine_every * 60, t0, kills)))
    for t in threads:
        t.start()
    try:
        run_job(job, cfg.train.steps, progress=False)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=sample_s + 5)
        job.close()
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    return {"faults": faults, "minutes": minutes, "samples": samples,
            **memory_figures(samples, warmup * minutes * 60),
            "steps": summary["steps"], "launched": summary["launched"],
            "trained": summary["trained"], "dropped": summary["dropped"],
            "accounted": summary["launched"] == summary["trained"]
            + sum(summary["dropped"].values()),
            "engine_kills": kills, "engine_recovery": summary.get("engine_recovery"),
            "engine_versions": summary.get("engine_versions"),
            "run_dir": str(job.run_dir.path)}


def memory_figures(samples: list[tuple[float, float, int]], warm_s: float) -> dict[str, Any]:
    after = [s for s in samples if s[0] >= warm_s]
    if len(after) < 4:
        return {"rss_warm_mib": None, "rss_end_mib": None, "growth_pct": None,
                "slope_mib_per_h": None}
    warm = after[0][1]
    end = statistics.median(s[1] for s in after[-3:])
    xs, ys = [s[0] for s in after], [s[1] for s in after]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return {"rss_warm_mib": round(warm, 1), "rss_end_mib": round(end, 1),
            "growth_pct": round(100 * (end - warm) / warm, 2),
            "rss_peak_mib": round(max(ys), 1), "slope_mib_per_h": round(slope * 3600, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rollart bench soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(EXAMPLES / "quickstart.yaml"))
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--faults", default=json.dumps(DEFAULT_FAULTS),
                    help="tasks[].env.faults for every task, as JSON")
    ap.add_argument("--warmup", type=float, default=0.25, help="fraction of the time")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--baseline", action="store_true",
                    help="first the same loop without faults, for the same time")
    ap.add_argument("--kill-engine-every", type=float, default=None, metavar="MIN",
                    help="also SIGKILL one engine worker's process every MIN minutes "
                         "(they take turns; Ray restarts it and it is reloaded)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    with tempfile.TemporaryDirectory(prefix="rollart-soak-") as tmp:
        runs = ([None] if args.baseline else []) + [json.loads(args.faults)]
        for faults in runs:
            r = soak(args.config, args.minutes, faults, args.warmup, args.sample_s, tmp,
                     args.overrides, args.kill_engine_every if faults else None)
            results.append(r)
            label = "faults" if faults else "no faults"
            print(f"{label}: {r['minutes']:g} min, {r['steps']} steps; driver RSS "
                  f"{r['rss_warm_mib']} MiB after warm-up -> {r['rss_end_mib']} MiB at the "
                  f"end ({r['growth_pct']} %, slope {r['slope_mib_per_h']} MiB/h, peak "
                  f"{r.get('rss_peak_mib')}); launched {r['launched']} = trained "
                  f"{r['trained']} + dropped {sum(r['dropped'].values())}: "
                  f"{'balanced' if r['accounted'] else 'NOT balanced'}; dropped {r['dropped']}")
            if r["engine_kills"]:
                print(f"  engine processes killed at (s, PID): {r['engine_kills']}; "
                      f"recovery {r['engine_recovery']}; versions {r['engine_versions']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["accounted"] for r in results) else 1
