"""In process (``layout: inprocess``) each worker runs on a thread of its own, as its Ray
actor does: the trainer's blocking methods on one thread, the torch engine's steps and
weight swaps on another, each with the torch thread count of the run's thread plan. In a
sync run the engine computes on the trainer's thread (they alternate): one OpenMP team
for both, with the trainer's threads (a second team in the process made GNU OpenMP stop
spinning at both teams' barriers: SmolLM2's train step +40 %, docs/benchmarks.md).

Before, a train step ran on whichever thread of the loop's pool was free: each step met
another thread's malloc arena and OpenMP team (SmolLM2: the step went from 3.5 to 8 s
after three steps, 10 GB resident), and a thread count set for one role leaked into the
other's steps (docs/benchmarks.md, "One thread per worker in process")."""

from __future__ import annotations

import threading

import pytest
import torch
from control_configs import two_tasks
from rollart_engine_torch import engine as engine_mod
from rollart_trainer_torch.trainer import TorchTrainer

from rollart_sdk.config import load_config
from rollart_sdk.job import build_job, run_job
from rollart_sdk.layout import Layout
from rollart_sdk.resources.threads import thread_plan

pytestmark = pytest.mark.timeout(600)


def _config(tmp_path, mode="sync"):
    # 3 cores in the plan (ray.num_cpus): sync plans the engine 2 threads, the trainer 3,
    # neither of them torch's default on this machine nor the process's 1 (in process the
    # engine then computes on the trainer's thread, with its 3).
    return load_config(data=two_tasks(
        roles={"actor_gen": {"workers": 1}}, tasks=[two_tasks()["tasks"][0]],
        rollout={"batch_size": 8, "group_size": 4, "mode": mode},
        engine={"name": "torch", "options": {"max_running": 32, "inline_step_s": 0.0}},
        ray={"num_cpus": 3}, train={"steps": 3, "bucket_mb": 1, "save_final_model": False},
    ), overrides=[f"output_dir={tmp_path}"])


def _spy(monkeypatch):
    seen: dict[str, list[tuple[int, int]]] = {"train": [], "step": [], "swap": []}

    def here() -> tuple[int, int]:
        return threading.get_ident(), torch.get_num_threads()

    real_train = TorchTrainer.train_step

    def train_step(self, batch):
        seen["train"].append(here())
        return real_train(self, batch)

    real_step = engine_mod._timed_step

    def timed_step(*args):
        seen["step"].append(here())
        return real_step(*args)

    real_stage = engine_mod.TorchEngine._stage

    def stage(self, buckets):
        seen["swap"].append(here())
        return real_stage(self, buckets)

    monkeypatch.setattr(TorchTrainer, "train_step", train_step)
    monkeypatch.setattr(engine_mod, "_timed_step", timed_step)
    monkeypatch.setattr(engine_mod.TorchEngine, "_stage", stage)
    return seen


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_inprocess_worker_keeps_one_thread_with_its_plans_torch_threads(
        tmp_path, monkeypatch, mode):
    monkeypatch.delenv("ROLLART_TORCH_THREADS", raising=False)
    seen = _spy(monkeypatch)
    cfg, lines = _config(tmp_path, mode)
    plan = thread_plan(cfg)
    assert (plan["actor_gen"], plan["actor_train"]) == ((2, 3) if mode == "sync" else (1, 1))
    job = build_job(cfg, lines, layout=Layout("inprocess", "inprocess", "test"),
                    log=lambda *a: None)
    try:
        run_job(job, 3, progress=False)
    finally:
        job.close()
    # (async defers a version that has not arrived yet: fewer swaps than steps)
    swaps = 3 if mode == "sync" else 1
    assert len(seen["train"]) == 3 and len(seen["swap"]) >= swaps and len(seen["step"]) >= 3
    (trainer,) = set(seen["train"])  # every train step: one thread, the trainer's count
    (engine,) = set(seen["step"] + seen["swap"])  # every step and swap: one thread
    main = threading.main_thread().ident
    assert main not in (trainer[0], engine[0])
    threads = (job.run_dir.path / "plan.json").read_text()
    if mode == "sync":  # the trainer's thread, its count: one OpenMP team in the process
        assert engine == trainer == (trainer[0], 3)
        assert '"engine_on_trainer_thread": true' in threads
    else:  # both compute at once: each on its own thread, with the plan's count
        assert trainer[0] != engine[0] and (trainer[1], engine[1]) == (1, 1)
        assert "engine_on_trainer_thread" not in threads


def test_a_direct_inprocess_job_keeps_the_process_thread_count(tmp_path, monkeypatch):
    """``build_job(in_process=True)`` without a chosen layout (tests, notebooks): every
    worker keeps ROLLART_TORCH_THREADS, else 1, whatever the plan says (two test processes
    share two cores)."""
    monkeypatch.delenv("ROLLART_TORCH_THREADS", raising=False)
    seen = _spy(monkeypatch)
    cfg, lines = _config(tmp_path)
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        run_job(job, 2, progress=False)
    finally:
        job.close()
    assert {n for _, n in seen["train"] + seen["step"]} == {1}
    assert len({t for t, _ in seen["train"]}) == 1


def test_the_engine_shares_the_trainers_thread_only_where_the_two_alternate(tmp_path):
    """Sync, in process, one engine, one trainer rank, the in-memory transport, no groups
    trained while the rollout goes on: the one case where engine and trainer never compute
    at once (elsewhere one would queue behind the other on the shared thread)."""
    from rollart_sdk.cluster.spawn import shares_compute

    def cfg(*overrides):
        return load_config(data=two_tasks(
            roles={"actor_gen": {"workers": 1}}, tasks=[two_tasks()["tasks"][0]],
            rollout={"batch_size": 8, "group_size": 4, "mode": "sync"}),
            overrides=[f"output_dir={tmp_path}", *overrides])[0]

    assert shares_compute(cfg(), in_process=True)
    assert shares_compute(cfg("transport.name=local"), in_process=True)
    assert not shares_compute(cfg(), in_process=False)  # on Ray: a process per worker
    assert not shares_compute(cfg("rollout.mode=async", "rollout.alpha=1"), in_process=True)
    assert not shares_compute(cfg("rollout.mode=one_off"), in_process=True)
    assert not shares_compute(cfg("train.stream_groups=true"), in_process=True)
    assert not shares_compute(cfg("roles.actor_gen.workers=2"), in_process=True)
    assert not shares_compute(cfg("roles.actor_train.workers=2"), in_process=True)
