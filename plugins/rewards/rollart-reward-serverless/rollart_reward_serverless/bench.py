"""``rollart bench reward``: the paper's R3 experiment at laptop scale, on the real pipeline.

Several jobs run at once (``--jobs``, default 3), each a real training run
(:mod:`rollart_reward_serverless.bench_job`: same workload, its own seed, the same seeds
in every arm) whose reward is the same LLM judge behind a URL. Two arms:

- ``dedicated``: each job reserves a judge replica of its own (a Ray Serve deployment
  pinned to one replica, min = max = 1), deployed before the job starts and removed when
  it ends - the paper's reward GPU reserved per job;
- ``serverless``: all jobs share ONE deployment that scales from zero (min 0, max
  ``--max-replicas``, default ``--jobs``: never more than the dedicated arm reserves),
  removed once it has scaled back to zero after the last job. Its autoscaling scales on
  real backlog: another replica only while more than ``--target-ongoing`` (32, what one
  judge replica batches at once: its engine runs 64 one-token requests per step) calls
  per replica are in flight or queued, for ``--upscale-delay-s`` (30 s, longer than a
  cold start plus the drain of the queue that built up during it, so Serve does not
  start a second replica behind a loading or just-loaded one).

Both arms use the same serving stack (HTTP, auth, the same replica code, the same
``max_ongoing_requests`` and CPUs per replica), so the figures isolate what R3 changes:
capacity reserved per job vs shared and scaled with demand.

Figures (JSON ``rows``: one per arm and repeat; ``median`` over repeats per arm):

- ``replica_utilisation``: sum of the replicas' busy seconds (at least one call in
  flight) over the sum of their reserved seconds (created -> closed, a cold start's model
  load included), both read from the replicas' own logs
  (:mod:`rollart_sdk.serverless.replica_log`);
- ``rollout_step_s``: median step time over every step of every job;
- ``reward_latency_p50_s``: median reward call as the EnvManager sees it (HTTP and
  queueing included);
- ``reserved_parts_s``: where the reserved seconds went, summed over the replicas (and
  ``replica_parts_s`` per replica): ``start_up_s`` (constructor to ready: the cold start's
  imports and model load), ``busy_s``, ``idle_s`` (ready, no call in flight, before its
  last call), ``tail_s`` (after its last call until it stopped: the idle tail before
  scale-down, or until its job's end was seen), ``before_log_s`` (Serve held the replica
  before its constructor ran: the actor's start, also a cold start). They sum to the
  reserved time;
- ``utilisation_serving``: busy over busy + idle, i.e. with cold starts and idle tails
  left OUT. Not the R3 figure (``replica_utilisation`` is): it says how well a replica
  was used once up, beside the figure that charges for getting it up and down;
- ``exposed_reward_s``: median over steps of the time the step waited on rewards only
  (rollart_sdk.control.metrics.reward_exposure); ``exposed_fraction``: total exposed
  time over total step time.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

JUDGE: dict[str, Any] = {
    "parser": "likelihood", "template": "Here is a {info[category]}:",
    "engine": {"name": "torch", "options": {"max_running": 64, "max_seq_len": 256}},
}
WORKLOAD = {"env_mu_s": 1.5, "env_sigma_s": 0.5, "batch_size": 64, "group_size": 4,
            "max_envs": 16}
HELD = ("STARTING", "RUNNING", "STOPPING")  # replica states that hold resources
KEYS = ["replica_utilisation", "utilisation_serving", "rollout_step_s", "reward_latency_p50_s", "exposed_reward_s",
        "exposed_fraction"]


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench reward: no {what} after {timeout_s:.0f} s")
        time.sleep(0.25)


class Arm:
    """One arm of one repeat: its deployments, its jobs and their results."""

    def __init__(self, args: argparse.Namespace, deployment: str, seed: int, port: int) -> None:
        self.args, self.deployment, self.seed, self.port = args, deployment, seed, port
        self.dir = Path(args.out).resolve() / f"{deployment}-r{seed}"
        self.logs = self.dir / "replicas"
        if self.dir.exists():  # a previous run's logs would count as this run's replicas
            shutil.rmtree(self.dir)
        self.logs.mkdir(parents=True)

    def options(self, app: str, lo: int, hi: int) -> Any:
        from rollart_sdk.serverless.deploy import DeployOptions

        return DeployOptions(
            backend={"name": "judge", "options": self.args.judge}, app=app, port=self.port,
            min_replicas=lo, max_replicas=hi, target_ongoing_requests=self.args.target_ongoing,
            max_ongoing_requests=self.args.max_ongoing, upscale_delay_s=self.args.upscale_delay_s,
            downscale_delay_s=self.args.downscale_delay_s,
            downscale_to_zero_delay_s=self.args.idle_s, num_cpus=0.5,
            replica_log=str(self.logs))

    def spec(self, job: int, url: str) -> Path:
        path = self.dir / f"job{job}.spec.json"
        path.write_text(json.dumps({
            "name": f"{self.deployment}-r{self.seed}-j{job}", "seed": 1000 * self.seed + job,
            "steps": self.args.steps, "url": url, "workload": self.args.workload,
            "out": str(self.dir / "runs"), "result": str(self.dir / f"job{job}.result.json")}))
        return path

    def launch(self, job: int, url: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        with open(self.dir / f"job{job}.log", "wb") as log:  # the child keeps its copy
            return subprocess.Popen(
                [sys.executable, "-m", "rollart_reward_serverless.bench_job",
                 str(self.spec(job, url))], stdout=log, stderr=subprocess.STDOUT, env=env)

    def run(self) -> dict[str, Any]:
        t0 = time.time()
        load0 = os.getloadavg()[0]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.apps: dict[int, str | None] = {}
        self.monitor: Any = None
        try:
            shared = self._start()
            self._wait_jobs()
            self._drain(shared)
        finally:
            self._clean_up()
        failed = {j: p.returncode for j, p in self.procs.items() if p.returncode != 0}
        if failed:
            raise RuntimeError(f"bench reward: job(s) failed {failed}; see {self.dir}/job*.log")
        results = [json.loads((self.dir / f"job{j}.result.json").read_text())
                   for j in range(self.args.jobs)]
        held = self.monitor.replica_seconds() if self.monitor is not None else 0.0
        row = summarise(self.deployment, results, self.logs, held)
        row.update(seed=self.seed, jobs=self.args.jobs, steps=self.args.steps,
                   wall_s=round(time.time() - t0, 1),
                   load_1m=[round(load0, 2), round(os.getloadavg()[0], 2)])  # start, end
        if shared is not None:
            row["replica_changes"] = [n for _, n in shared.running[shared.app]]  # RUNNING
        return row

    def _monitored(self, apps: list[str]) -> Any:
        """Serve's view of every replica of ``apps`` holding resources, start-up included:
        a cross-check of (and a floor under) the reserved time the replicas log. One
        monitor per arm, one status call per poll (the Serve controller's status costs
        CPU the judges share: the same polling in both arms)."""
        from rollart_sdk.serverless.deploy import ReplicaMonitor

        self.monitor = ReplicaMonitor(apps, emit=self._say, interval_s=0.5, states=HELD).start()
        return self.monitor

    def _start(self) -> Any:
        """Deploy and launch the jobs; the shared deployment's monitor (serverless)."""
        from rollart_sdk.serverless.deploy import deploy

        jobs = self.args.jobs
        if self.deployment == "serverless":
            app = f"r3-serverless-r{self.seed}"
            shared = self._monitored([app])
            url = deploy(self.options(app, 0, self.args.max_replicas), self.token)
            self.procs = {j: self.launch(j, url) for j in range(jobs)}
            return shared
        self.apps = {j: f"r3-dedicated-r{self.seed}-j{j}" for j in range(jobs)}
        self._monitored([a for a in self.apps.values() if a is not None])
        for dedicated in self.apps.values():  # each job reserves its replica (all start
            assert dedicated is not None  # at once) ...
            deploy(self.options(dedicated, 1, 1), self.token, wait=False)
        return None

    def _wait_jobs(self) -> None:
        """Until every job ends; a dedicated replica is removed when its job ends."""
        from ray import serve

        from rollart_sdk.serverless.deploy import replica_counts

        limit = self.args.job_timeout_s
        deadline = time.monotonic() + limit
        while len(self.procs) < self.args.jobs or not all(
                p.poll() is not None for p in self.procs.values()):
            waiting = {j: app for j, app in self.apps.items()
                       if j not in self.procs and app is not None}
            if waiting:  # ... and starts once its replica is up
                up = replica_counts(list(waiting.values()))
                for j, app in waiting.items():
                    if up[app] >= 1:
                        self.procs[j] = self.launch(j, f"http://127.0.0.1:{self.port}/{app}")
            for j, p in self.procs.items():
                ended = self.apps.get(j)
                if p.poll() is not None and ended is not None:
                    serve.delete(ended, _blocking=False)  # its reservation ends
                    self.apps[j] = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench reward: {self.deployment} jobs still running "
                                   f"after {limit:.0f} s (--job-timeout-s)")
            time.sleep(0.5)
        for j, left in list(self.apps.items()):  # jobs that ended after the last poll
            if left is not None:
                serve.delete(left, _blocking=False)
                self.apps[j] = None

    def _drain(self, shared: Any) -> None:
        """The shared deployment scales to zero by itself (its idle tail is reserved
        time); then every replica is gone and has logged "closed"."""
        from ray import serve

        from rollart_sdk.serverless.deploy import replica_count, replica_counts

        if shared is not None:
            _wait(lambda: replica_count(shared.app, HELD) == 0, self.args.idle_s + 60,
                  "scale-down to zero")
            serve.delete(shared.app)
        apps = list(self.monitor.apps)
        _wait(lambda: not any(replica_counts(apps, HELD).values()), 60, "replica shutdown")
        time.sleep(1.0)  # the monitor's last poll

    def _clean_up(self) -> None:
        from ray import serve

        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        if self.monitor is not None:
            self.monitor.stop()
        for app in self.apps.values():
            if app is not None:
                serve.delete(app)

    @property
    def token(self) -> str:
        from rollart_sdk.serverless.deploy import TOKEN_ENV

        return os.environ[TOKEN_ENV]

    def _say(self, line: str) -> None:
        print(f"  {line}", flush=True)


def summarise(deployment: str, results: list[dict[str, Any]], logs: Path,
              held_s: float = 0.0) -> dict[str, Any]:
    """One row from the jobs' results and the replicas' logs; ``held_s``: Serve's
    replica-seconds (start-up included), the floor of the reserved time."""
    from rollart_sdk.control.scheduler import is_failure
    from rollart_sdk.serverless.replica_log import read_usage

    usage = read_usage(logs)
    busy = sum(u.busy_s for u in usage)
    logged = sum(u.reserved_s for u in usage)
    reserved = max(logged, held_s)
    steps = [s for r in results for s in r["steps"]]
    step_times = [s["step_s"] for s in steps]
    exposed = [s["exposed_reward_s"] for s in steps]
    latencies = [x for r in results for x in r["reward_latencies_s"]]
    start_ups = [u.start_up_s for u in usage if u.start_up_s is not None]
    parts = [u.breakdown() for u in usage]
    part = {k: sum(p[k] for p in parts) for k in ("start_up_s", "busy_s", "idle_s", "tail_s")}
    # Serve held replicas longer than they logged: their actor starting before the
    # constructor ran (part of the cold start, reserved, not in any replica's log).
    part["before_log_s"] = reserved - logged
    serving = part["busy_s"] + part["idle_s"]
    return {
        "deployment": deployment,
        "replica_utilisation": round(busy / reserved, 4) if reserved else None,
        "rollout_step_s": round(statistics.median(step_times), 3),
        "reward_latency_p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "exposed_reward_s": round(statistics.median(exposed), 4),
        "exposed_fraction": round(sum(exposed) / sum(step_times), 4),
        "exposed_reward_max_s": round(max(exposed), 3),
        "busy_s": round(busy, 2), "reserved_s": round(reserved, 2),
        "reserved_logged_s": round(logged, 2), "serve_held_s": round(held_s, 2),
        "replicas": len(usage), "replicas_unclosed": sum(not u.closed for u in usage),
        "replica_start_up_s": round(statistics.median(start_ups), 2) if start_ups else None,
        # Where the reserved seconds went (sums to reserved_s), and per replica.
        "reserved_parts_s": {k: round(v, 2) for k, v in part.items()},
        "replica_parts_s": [{k: round(v, 2) for k, v in p.items()} | {"calls": u.calls}
                            for p, u in zip(parts, usage, strict=True)],
        # NOT the R3 figure: busy over the time replicas were ready and serving (cold
        # starts, idle tails and the actor start left out); beside replica_utilisation.
        "utilisation_serving": round(part["busy_s"] / serving, 4) if serving else None,
        "judged": len(latencies),
        "trained": sum(r["trained"] for r in results),
        # dropped for a fault (a reward that failed...: the scheduler's is_failure); the
        # control plane's own discards apart (run-end aborts, the rest of their groups)
        "dropped": sum(n for r in results for k, n in r["dropped"].items() if is_failure(k)),
        "discarded_at_end": sum(n for r in results for k, n in r["dropped"].items()
                                if not is_failure(k)),
        "job_run_s": [round(r["run_ended"] - r["run_started"], 1) for r in results],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rollart bench reward", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=3, help="concurrent jobs per arm")
    p.add_argument("--steps", type=int, default=15, help="training steps per job")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--deployments", default="dedicated,serverless")
    p.add_argument("--max-replicas", type=int, default=None,
                   help="serverless max replicas (default --jobs: at most the capacity the "
                   "dedicated arm reserves)")
    p.add_argument("--target-ongoing", type=float, default=32.0,
                   help="serverless: calls in flight or queued per replica before another "
                   "starts (default: what one judge replica batches at once)")
    p.add_argument("--max-ongoing", type=int, default=64,
                   help="calls one replica takes at once; more wait in Serve's queue")
    p.add_argument("--upscale-delay-s", type=float, default=30.0,
                   help="serverless: seconds the backlog must last before another replica "
                   "starts (longer than a cold start: no replica behind a loading one)")
    p.add_argument("--downscale-delay-s", type=float, default=10.0,
                   help="serverless: seconds of less demand before a replica stops (2 -> 1)")
    p.add_argument("--idle-s", type=float, default=2.0,
                   help="serverless: idle seconds before scaling to zero")
    p.add_argument("--workload", type=json.loads, default=WORKLOAD,
                   help=f"JSON, default {json.dumps(WORKLOAD)}")
    p.add_argument("--judge", type=json.loads, default=JUDGE,
                   help="JSON options of reward judge (default SmolLM2-135M, likelihood)")
    p.add_argument("--job-timeout-s", type=float, default=900.0)
    p.add_argument("--out", default="runs/bench-reward", help="run directories go here")
    p.add_argument("--json", help="write {rows, median} here")
    args = p.parse_args(argv)
    args.workload = {**WORKLOAD, **args.workload}
    if args.max_replicas is None:
        args.max_replicas = args.jobs
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import ray
    from ray import serve

    from rollart_sdk.job import _free_port
    from rollart_sdk.ray_utils import init_ray
    from rollart_sdk.serverless.deploy import TOKEN_ENV

    os.environ[TOKEN_ENV] = secrets.token_hex(16)  # the jobs inherit it; never printed
    init_ray(num_cpus=2 * args.jobs + 2, log_to_driver=False)
    port = _free_port()
    rows = []
    try:
        for seed in range(args.repeats):
            for deployment in args.deployments.split(","):
                print(f"{deployment}, repeat {seed}: {args.jobs} jobs x {args.steps} steps",
                      flush=True)
                row = Arm(args, deployment, seed, port).run()
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        serve.shutdown()
        ray.shutdown()
    median: dict[str, dict[str, float]] = {}
    for deployment in args.deployments.split(","):
        mine = [r for r in rows if r["deployment"] == deployment]
        median[deployment] = {k: statistics.median(r[k] for r in mine if r[k] is not None)
                              for k in KEYS if any(r[k] is not None for r in mine)}
    print(f"{'deployment':<12}" + "".join(f"{k:>24}" for k in KEYS))
    for deployment, m in median.items():
        print(f"{deployment:<12}" + "".join(f"{m.get(k, float('nan')):>24.4f}" for k in KEYS))
    if args.json:
        meta = {"jobs": args.jobs, "steps": args.steps, "repeats": args.repeats,
                "workload": args.workload, "judge": args.judge,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "load_average": os.getloadavg()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "median": median}, f, indent=1)
    return 0
