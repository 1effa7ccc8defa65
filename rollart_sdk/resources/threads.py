"""Threads per role on a small machine: the roles share cores without oversubscription.

Torch's default is one intra-op thread per core in every process; four processes on two
cores then run eight compute threads, and a contended op is many times slower (issue 12
measured it). The rule here counts what runs at the same time on this machine:

- ``sync``: rollout and training alternate. While the engines generate, the control
  plane (EnvManagers, the LLMProxy: one core's worth of Python) runs beside them; while the
  trainer steps, nothing else does. Engines get ``(cores - 1) / engines`` threads each,
  trainer ranks ``cores / ranks``. An engine's long steps (``actor_gen_burst``: the step
  before took at least the torch engine's ``burst_step_s``) take ``cores / engines``:
  between them the control plane's work is short (SmolLM2 on Ray: generation 1.14 ->
  0.83 s a step; a tiny model's short steps keep the one thread).
- ``async``: engines, trainer and control plane run at once: ``cores - 1`` threads are
  split over every engine and trainer rank.
- env and reward workers: 1 (their work is Python, not torch ops).
- in one process (``layout: inprocess``) each worker runs on a thread of its own (the
  engine's steps on the engine's), and torch's thread count is per thread (OpenMP's and
  MKL's settings are thread-local; a new thread starts from the last one set anywhere),
  so ``rollart train`` applies the same per-role figures there; in a sync run with one
  engine and one trainer rank the torch engine computes on the trainer's thread, with its
  figure (``cluster/spawn.py::shares_compute``: one OpenMP team in the process). A direct
  ``build_job(in_process=True)`` (tests, notebooks) keeps ``ROLLART_TORCH_THREADS`` or 1
  for every worker. The ``process`` figure (the trainer's in sync mode, the shared split
  in async mode) is what ``rollart eval`` gives its one engine.

Every figure is at least 1. ``ROLLART_TORCH_THREADS`` overrides the plan for every role, and
a backend's own ``num_threads`` option (engine or trainer) wins inside its process.
"""

from __future__ import annotations

import os
from typing import Any


def machine_cores(cfg: Any) -> int:
    """Cores this run may use: ``ray.num_cpus`` when set (a local Ray), else the
    machine's (the process's CPU affinity where the OS reports it)."""
    if cfg.ray.num_cpus:
        return int(cfg.ray.num_cpus)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_plan(cfg: Any, cores: int | None = None) -> dict[str, int]:
    """Torch intra-op threads per role: ``actor_gen``, ``actor_train``, ``environment``,
    ``reward``, and ``process`` (the one figure of an in-process run)."""
    cores = cores or machine_cores(cfg)
    gen = cfg.roles.actor_gen
    engines = (gen.prefill.workers + gen.decode.workers
               if gen.disaggregated else gen.workers)
    ranks = cfg.roles.actor_train.workers
    control = 1  # the EnvManagers' and the proxy's Python
    if cfg.rollout.mode == "sync":
        per_engine = max(1, (cores - control) // engines)
        per_rank = max(1, cores // ranks)
        process = max(1, cores // ranks)
    else:
        per_engine = per_rank = max(1, (cores - control) // (engines + ranks))
        process = max(1, cores - control)
    # An engine's long steps (sync: nothing else computes while the engines generate; the
    # control plane's Python is short work between them): every core it can share.
    # (Not with train.stream_groups, which trains while the rollout goes on.)
    alternate = cfg.rollout.mode == "sync" and cfg.train.stream_groups is False
    burst = max(1, cores // engines) if alternate else per_engine
    plan = {"actor_gen": per_engine, "actor_gen_burst": burst, "actor_train": per_rank,
            "environment": 1, "reward": 1, "process": process, "cores": cores}
    override = os.environ.get("ROLLART_TORCH_THREADS")
    if override:
        n = max(1, int(override))
        plan.update({k: n for k in ("actor_gen", "actor_gen_burst", "actor_train",
                                    "process")})
    return plan
