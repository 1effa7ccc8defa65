"""One job of ``rollart bench reward``: a real run whose reward is a judge behind a URL.

Run by the bench as ``python -m rollart_reward_serverless.bench_job SPEC.json``; it trains
``spec["steps"]`` steps of the workload below (the real control plane, every worker in
this process) with reward ``serverless`` pointed at ``spec["url"]`` - the job's own
dedicated replica or the shared serverless deployment, the job cannot tell which - and
writes what it measured to ``spec["result"]``.

The workload is an agentic task where the environment, not the judge, is the slow part:
env ``category`` (one-word answers a rule cannot score) with every env call (reset and
step) taking N(mu, sigma) seconds - a tool call or a sandbox - drawn per trajectory from a
seeded RNG, so every arm sees the same draws. The judge scores each trajectory the moment
its rollout ends, overlapped with the other trajectories' rollouts.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rollart_sdk.serverless.deploy import TOKEN_ENV


def job_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The run config of one job (same for every arm; only the reward URL differs)."""
    w = spec["workload"]
    return {
        "name": f"bench-reward-{spec['name']}", "seed": spec["seed"],
        "model": {"tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                           "intermediate_size": 128, "seed": 0}},
        "pools": [{"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 8}],
        "tasks": [{
            "tag": "Category", "max_turns": 1, "constrain_actions": True, "system_prompt": None,
            "env": {"name": "category", "faults": {"latency": {"mu": w["env_mu_s"],
                                                               "sigma": w["env_sigma_s"]}}},
            # Patient with the endpoint: on this shared machine Serve's proxy can restart
            # under memory pressure; a call retries for about a minute (1+2+...+32 s)
            # before its trajectory is dropped (counted in the row's "dropped").
            "reward": {"name": "serverless", "options": {
                "url": spec["url"], "token_env": TOKEN_ENV, "timeout_s": 120, "retries": 6,
                "backoff_s": 1.0, "breaker_failures": 1000}},
            "reward_timeout_s": 300,
        }],
        "engine": {"name": "torch", "options": {"max_running": 64}},
        "trainer": {"name": "torch", "options": {"lr": 0.001, "micro_batch_size": 64}},
        "transport": {"name": "local"},
        "rollout": {"batch_size": w["batch_size"], "group_size": w["group_size"],
                    "max_envs": w["max_envs"], "mode": "async", "alpha": 1},
        "train": {"steps": spec["steps"], "bucket_mb": 4, "save_final_model": False},
        "output_dir": spec["out"],
    }


def main(argv: list[str] | None = None) -> int:
    from rollart_sdk.config import load_config
    from rollart_sdk.control.metrics import reward_exposure
    from rollart_sdk.job import build_job, run_job

    (path,) = argv if argv is not None else sys.argv[1:]
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    import rollart_sdk.control.pipeline as pipeline_module

    # Every step's trajectories are read after the run (reward_exposure): keep them all.
    pipeline_module.KEEP_BATCHES = max(pipeline_module.KEEP_BATCHES, int(spec["steps"]))
    cfg, lines = load_config(data=job_config(spec))
    t_build = time.time()
    job = build_job(cfg, lines, log=lambda *a: None, in_process=True)
    try:
        t_run = time.time()
        records = run_job(job, spec["steps"], progress=False)
        summary = json.loads((job.run_dir.path / "summary.json").read_text())
    finally:
        job.close()
    out = {"name": spec["name"], "built_s": t_run - t_build, "run_started": t_run,
           "run_ended": time.time(), "launched": summary["launched"],
           "trained": summary["trained"], "dropped": summary["dropped"]}
    out.update(reward_exposure(records, job.pipeline.started))
    with open(spec["result"], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
