"""``rollart bench reward``: the paper's R3 experiment at laptop scale, on the real pipeline.

The same run twice over - the quickstart's FrozenLake beside the ``category`` task scored
by reward ``judge`` (SmolLM2-135M-Instruct) - once with the judge on a dedicated reward
worker reserved for the whole run, once with the same judge deployed on Ray Serve
(``serverless`` with ``deploy:``, scaling from zero, autoscaled). Same config, seeds,
steps and capacity; ``--repeats`` runs of each, the median reported.

Columns (JSON ``rows``, one per run, and ``median`` per deployment):

- ``replica_utilisation``: judge busy time (at least one call in flight) over reserved
  time: the run's wall time for the dedicated worker; replica-seconds (the integral of
  the running replica count, polled every 0.25 s) for Serve;
- ``rollout_step_s``: median time between consecutive batches;
- ``reward_latency_p50_s``: median reward call, as the EnvManager sees it (HTTP and
  queueing included);
- ``exposed_reward_s``: per step, how long the batch waited on rewards after its last
  rollout ended (``max reward end - max rollout end`` over the batch, floored at 0),
  median over steps; ``exposed_fraction`` divides it by the step time.

What it does not show: the paper's reward GPUs served many jobs; here one run feeds one
judge on a shared 2-core CPU, so utilisation depends on how bursty this run's traffic is.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from typing import Any

JUDGE = {"parser": "likelihood", "template": "Here is a {info[category]}:",
         "engine": {"name": "torch", "options": {"max_running": 64, "max_seq_len": 256}}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_config(deployment: str, steps: int, seed: int, mode: str, out: str) -> dict[str, Any]:
    if deployment == "dedicated":
        reward: dict[str, Any] = {"name": "judge", "options": JUDGE}
    else:
        reward = {"name": "serverless", "options": {
            "timeout_s": 120, "retries": 1,
            "deploy": {"backend": {"name": "judge", "options": JUDGE}, "port": _free_port(),
                       "min_replicas": 0, "max_replicas": 2, "target_ongoing_requests": 16,
                       "downscale_delay_s": 1.0, "downscale_to_zero_delay_s": 2.0}}}
    return {
        "name": f"bench-reward-{deployment}", "seed": seed,
        "model": {"tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                           "intermediate_size": 128, "seed": 0}},
        "pools": [{"name": "H800", "hardware": "H800", "kind": "gpu", "profile": "compute", "count": 2},
                  {"name": "H20", "hardware": "H20", "kind": "gpu", "profile": "bandwidth", "count": 2},
                  {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 8}],
        "roles": {"actor_gen": {"workers": 2}},
        "tasks": [
            {"tag": "FrozenLake", "affinity": "H800", "max_turns": 10, "constrain_actions": True,
             "system_prompt": None,
             "env": {"name": "frozenlake", "options": {"desc": ["SFF", "FHF", "FFG"],
                                                       "obs_format": "compact"}},
             "reward": {"name": "rule", "options": {"mode": "success"}}},
            {"tag": "Category", "affinity": "H20", "max_turns": 1, "constrain_actions": True,
             "system_prompt": None, "env": {"name": "category"}, "reward": reward},
        ],
        "engine": {"name": "torch", "options": {"max_running": 64}},
        "trainer": {"name": "torch", "options": {"lr": 0.001, "micro_batch_size": 64}},
        "transport": {"name": "ray"},
        "rollout": {"batch_size": 32, "group_size": 8, "mode": mode, "alpha": 1},
        "train": {"steps": steps, "bucket_mb": 4, "save_final_model": False},
        "output_dir": out,
    }


def _spans(traj: Any) -> tuple[float, float | None, float | None]:
    rollout_end = max((t1 for span, _, t1 in traj.timings if span != "reward"), default=0.0)
    rewards = [(t0, t1) for span, t0, t1 in traj.timings if span == "reward"]
    if not rewards:
        return rollout_end, None, None
    t0, t1 = rewards[-1]
    return rollout_end, t1, t1 - t0


def measure(records: list[Any], wall_s: float, reserved_s: float | None) -> dict[str, Any]:
    """The row's numbers from the run's step records (see the module doc)."""
    judged = [t for r in records for t in r.batch if t.tag == "Category"]
    latencies = [lat for t in judged if (lat := _spans(t)[2]) is not None]
    exposed = []
    for r in records:
        spans = [_spans(t) for t in r.batch]
        ends = [s[1] for s in spans if s[1] is not None]
        if ends:
            exposed.append(max(0.0, max(ends) - max(s[0] for s in spans)))
    formed = [r.formed_at for r in records if r.formed_at]
    steps = [b - a for a, b in zip(formed, formed[1:], strict=False)]
    busy: dict[str, float] = {}
    for t in judged:
        d = t.info.get("reward_details") or {}
        if "judge_id" in d:
            busy[d["judge_id"]] = max(busy.get(d["judge_id"], 0.0), float(d["judge_busy_s"]))
    step_s = statistics.median(steps) if steps else wall_s
    reserved = reserved_s if reserved_s is not None else wall_s
    exposed_s = statistics.median(exposed) if exposed else 0.0
    return {
        "replica_utilisation": round(sum(busy.values()) / reserved, 4) if reserved else None,
        "judge_busy_s": round(sum(busy.values()), 2),
        "reserved_s": round(reserved, 2),
        "replicas_seen": len(busy),
        "rollout_step_s": round(step_s, 3),
        "reward_latency_p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "exposed_reward_s": round(exposed_s, 4),
        "exposed_fraction": round(exposed_s / step_s, 4) if step_s else None,
        "judged": len(judged),
        "wall_s": round(wall_s, 1),
    }


def run_once(deployment: str, steps: int, seed: int, mode: str, out: str) -> dict[str, Any]:
    from rollart_sdk.cluster.serve_app import ReplicaMonitor
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job

    cfg, lines = load_config(data=run_config(deployment, steps, seed, mode, out))
    job = build_job(cfg, lines, log=lambda *a: None)
    monitor = None
    try:
        if deployment == "serverless":
            monitor = ReplicaMonitor("reward-judge", emit=lambda line: print(line, flush=True),
                                     interval_s=0.25).start()
        t0 = time.monotonic()
        records = run_job(job, steps, progress=False)
        wall = time.monotonic() - t0
        reserved = None
        if monitor is not None:
            reserved = monitor.replica_seconds(until=time.monotonic() - monitor.started)
    finally:
        if monitor is not None:
            monitor.stop()
        job.close()
    row = {"deployment": deployment, "seed": seed, "mode": mode, "steps": steps}
    row.update(measure(records, wall, reserved))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rollart bench reward", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mode", default="async", choices=["sync", "one_off", "async"])
    p.add_argument("--deployments", default="dedicated,serverless")
    p.add_argument("--out", default="runs/bench-reward", help="run directories go here")
    p.add_argument("--json", help="write {rows, median} here")
    args = p.parse_args(argv)
    rows = []
    for seed in range(args.repeats):
        for deployment in args.deployments.split(","):
            row = run_once(deployment, args.steps, seed, args.mode, args.out)
            print(json.dumps(row), flush=True)
            rows.append(row)
    keys = ["replica_utilisation", "rollout_step_s", "reward_latency_p50_s", "exposed_reward_s",
            "exposed_fraction"]
    median = {}
    for deployment in args.deployments.split(","):
        mine = [r for r in rows if r["deployment"] == deployment]
        median[deployment] = {k: statistics.median(r[k] for r in mine if r[k] is not None)
                              for k in keys if any(r[k] is not None for r in mine)}
    print(f"{'deployment':<12}" + "".join(f"{k:>24}" for k in keys))
    for deployment, m in median.items():
        print(f"{deployment:<12}" + "".join(f"{m.get(k, float('nan')):>24.4f}" for k in keys))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "median": median}, f, indent=1)
    return 0
