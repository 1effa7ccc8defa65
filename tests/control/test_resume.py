"""`rollart train --resume RUN_DIR`: a stopped run continues from its newest checkpoint.

In-process (the real torch engine, trainer and envs; no Ray): a run stopped after 2 of 4
steps is resumed, and the step numbering, metrics.jsonl, accounting and RNG continue.
The same through `rollart train` on Ray with SIGINT: tests/control/test_failures_ray.py.
"""

from __future__ import annotations

import copy
import json

import pytest
from control_configs import two_tasks

from rollart_sdk.config import load_config
from rollart_sdk.control import checkpoints
from rollart_sdk.control.resume import RUN_STATE, newest_resumable
from rollart_sdk.errors import RollartError
from rollart_sdk.job import ResumePoint, build_job, run_job

pytestmark = pytest.mark.timeout(900)


def config(tmp_path, *overrides):
    data = two_tasks(train={"steps": 4, "bucket_mb": 1, "save_final_model": False})
    return load_config(data=copy.deepcopy(data), overrides=[f"output_dir={tmp_path}", *overrides])


def run(cfg, lines, steps, resume=None):
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None, resume=resume)
    try:
        run_job(job, steps, progress=False)
    finally:
        job.close()
    return job


def test_a_stopped_run_resumes_where_it_stopped(tmp_path):
    cfg, lines = config(tmp_path, "rollout.mode=one_off")
    first = run(cfg, lines, 2)  # stopped after 2 of train.steps=4 (as a Ctrl-C would)
    path = first.run_dir.path
    ckpt = newest_resumable(path)
    assert ckpt is not None and ckpt.name == "step-2"
    state = json.loads((ckpt / RUN_STATE).read_text())
    assert state["step"] == 2 and state["version"] == 2
    before = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in before] == [1, 2]
    s1 = json.loads((path / "summary.json").read_text())

    resume = ResumePoint.prepare(cfg, path, 4)
    second = run(cfg, lines, 4, resume=resume)
    assert second.run_dir.path == path  # the same run directory
    p = second.pipeline
    assert p.log[0] == "restore:2" and p.first_step == 2
    metrics = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    assert metrics[:2] == before  # appended to, not rewritten
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    # The trainer continued from the checkpoint's version (2), and the engines serve it.
    assert [m["version"] for m in metrics[2:]] == [2, 3]
    # Per-step deltas of the first resumed step count from the restored totals.
    assert metrics[2]["rollout/launched_step"] == (metrics[2]["rollout/launched"]
                                                  - state["launched"])
    assert metrics[2]["engine_version"] >= 2
    assert metrics[2]["wall_time"] >= before[-1]["wall_time"]  # wall time continues
    # Counts continue: the second session starts from the first one's totals.
    s2 = json.loads((path / "summary.json").read_text())
    assert s2["steps"] == 4 and s2["resumes"] == 1 and s2["resumed_from"] == str(ckpt)
    assert s2["launched"] == s2["trained"] + sum(s2["dropped"].values())
    assert s2["trained"] == s1["trained"] + 2 * 8 and s2["launched"] > s1["launched"]
    # RNG and counters continue: no trajectory id of the first session is reused.
    assert p.scheduler._traj_counter > state["traj_counter"]
    assert p.scheduler._group_counter > state["group_counter"]
    final = json.loads((path / "checkpoints" / "step-4" / RUN_STATE).read_text())
    assert final["step"] == 4 and final["resumes"] == 1
    # The checkpoint resumed from is untouched; both are complete and verified.
    assert json.loads((ckpt / RUN_STATE).read_text()) == state
    assert checkpoints.verify(ckpt) is None and checkpoints.verify(path / "checkpoints" / "step-4") is None
    # The summary covers the whole run, not the second session alone: the learning
    # figures' first step is the run's step 1, every trained trajectory is in the
    # staleness histogram, and what the first session counted is carried over.
    assert len(final["summary"]["task_stats"]) == 4
    assert s2["learning"] and all(
        s2["learning"][tag][f"{key}_first_step"] == s1["learning"][tag][f"{key}_first_step"]
        for tag in s1["learning"] for key in ("reward", "success"))
    assert sum(s1["rollout"]["staleness_hist"].values()) == s1["trained"]
    assert sum(s2["rollout"]["staleness_hist"].values()) == s2["trained"]
    assert s2["rollout"]["spanning_update"] >= s1["rollout"]["spanning_update"]


def test_resume_refuses_a_changed_config_and_a_finished_run(tmp_path):
    cfg, lines = config(tmp_path)
    first = run(cfg, lines, 1)
    path = first.run_dir.path
    changed, _ = config(tmp_path, "rollout.alpha=3")
    with pytest.raises(RollartError, match=r"rollout.alpha: run has 1, now 3.*only train.steps"):
        ResumePoint.prepare(changed, path, 4)
    more, _ = config(tmp_path, "train.steps=6")  # allowed: train further
    assert ResumePoint.prepare(more, path, 6).changed == ["train.steps"]
    with pytest.raises(RollartError, match=r"1 steps done, and the run stops at 1.*train.steps=2"):
        ResumePoint.prepare(cfg, path, 1)
    with pytest.raises(RollartError, match="not a run directory"):
        ResumePoint.prepare(cfg, tmp_path, 4)
    ckpts = path / "checkpoints"  # what a save cut by a kill leaves: a hidden folder
    (ckpts / "step-1").rename(ckpts / ".step-1.0123abcd.partial")
    with pytest.raises(RollartError, match="no complete checkpoint"):
        ResumePoint.prepare(cfg, path, 4)


def test_the_run_summary_counts_steps_whose_batches_were_freed(tmp_path, monkeypatch):
    """The pipeline frees the trajectories of all but the last KEEP_BATCHES steps; the
    summary's staleness, spanning and length bias still cover every step."""
    import rollart_sdk.control.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "KEEP_BATCHES", 1)
    cfg, lines = config(tmp_path)
    job = run(cfg, lines, 4)
    p = job.pipeline
    assert sum(1 for r in p.records if r.batch) <= 2  # the batches of steps 1-2 are gone
    s = json.loads((job.run_dir.path / "summary.json").read_text())
    assert sum(s["rollout"]["staleness_hist"].values()) == s["trained"] == 4 * cfg.rollout.batch_size
    assert s["rollout"]["spanning_update"] == sum(r.spanning for r in p.records)
    assert set(s["rollout"]["length_bias"]) == {t.tag for t in cfg.tasks}


def _snapshot(path):
    """Every file of a run directory that a failed resume must leave as it was."""
    skip = {"events.jsonl", "drops.jsonl", "plan.json", "bindings.json"}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name not in skip}


def test_a_corrupted_or_unloadable_checkpoint_falls_back_and_a_failed_resume_writes_nothing(
        tmp_path, monkeypatch):
    import rollart_trainer_torch.checkpoint as torch_ckpt

    from rollart_sdk.control.resume import ResumeFailed

    cfg, lines = config(tmp_path, "train.checkpoint_every=1", "train.keep_checkpoints=2",
                        "train.save_final_model=true")
    path = run(cfg, lines, 3).run_dir.path
    ckpts = path / "checkpoints"
    # Saved at every step, the newest 2 kept; the final save at step 3 was the periodic one.
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-2", "step-3"]
    assert (path / "final_model" / "config.json").is_file()
    # A torn file in the newest: verification catches it, the one before is taken.
    model = ckpts / "step-3" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])
    resume = ResumePoint.prepare(cfg, path, 4)
    assert resume.checkpoint == ckpts / "step-2"
    assert resume.skipped == [f"step-3: model.safetensors is 100 bytes, the manifest says "
                              f"{json.loads((ckpts / 'step-3' / 'manifest.json').read_text())['files']['model.safetensors']['size']:,} "
                              "(a torn or truncated file)"]
    # The trainer cannot load any of them (e.g. another model): nothing on disk changes.
    before = _snapshot(path)
    def refuse(src, *a, **kw):
        raise ValueError(f"cannot load {src.name}")

    monkeypatch.setattr(torch_ckpt, "read", refuse)
    with pytest.raises(ResumeFailed, match=r"step-2: the trainer could not load it.*"
                       r"cannot load step-2.*nothing in the run directory was changed"):
        run(cfg, lines, 4, resume=ResumePoint.prepare(cfg, path, 4))
    assert _snapshot(path) == before


def test_an_unloadable_checkpoint_is_skipped_for_the_one_before(tmp_path, monkeypatch):
    import rollart_trainer_torch.checkpoint as torch_ckpt

    cfg, lines = config(tmp_path, "train.checkpoint_every=1")
    path = run(cfg, lines, 3).run_dir.path
    real = torch_ckpt.read
    monkeypatch.setattr(torch_ckpt, "read", lambda src, *a, **kw: (
        (_ for _ in ()).throw(ValueError("bad")) if src.name == "step-3" else real(src, *a, **kw)))
    job = run(cfg, lines, 4, resume=ResumePoint.prepare(cfg, path, 4))
    assert job.resume.checkpoint.name == "step-2" and job.pipeline.log[0] == "restore:2"
    metrics = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # step 3's line was redone
    rolled = [json.loads(x) for x in (path / "metrics.rolledback.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rolled] == [3]
    s = json.loads((path / "summary.json").read_text())
    assert s["steps"] == 4 and s["resumed_from"].endswith("step-2")
    assert s["launched"] == s["trained"] + sum(s["dropped"].values())


def test_a_failed_save_keeps_the_previous_checkpoint_and_the_run_goes_on(tmp_path, monkeypatch):
    import errno

    import rollart_trainer_torch.checkpoint as torch_ckpt

    real = torch_ckpt.write
    failing = {"from": 2, "to": 2}  # saves (1-based) that hit a full disk

    def write(out, model, opt, meta, **kw):
        n = meta["version"]
        if failing["from"] <= n <= failing["to"]:
            (out.parent / f".{out.name}.partial").mkdir(exist_ok=True)  # half-written
            raise OSError(errno.ENOSPC, "No space left on device")
        real(out, model, opt, meta, **kw)

    monkeypatch.setattr(torch_ckpt, "write", write)
    cfg, lines = config(tmp_path, "train.checkpoint_every=1")
    job = run(cfg, lines, 4)
    path = job.run_dir.path
    s = json.loads((path / "summary.json").read_text())
    assert s["error"] is None and s["steps"] == 4
    (line,) = s["checkpoint_errors"]
    assert line.startswith("checkpoint step-2 failed: ") and "No space left" in line
    assert "step-1 stays the newest (1 in a row; the run stops at 3)" in line
    ckpts = path / "checkpoints"
    # step-2 was never published; the cut save's hidden folder was removed by the next.
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-1", "step-3", "step-4"]
    assert all(checkpoints.verify(c) is None for c in checkpoints.complete(ckpts))
    # Every save from the second on fails: the run stops at the third failure in a row,
    # by its rule, with step-1 as its newest checkpoint.
    failing["to"] = 99
    cfg, lines = config(tmp_path, "train.checkpoint_every=1", "train.steps=8")
    with pytest.raises(Exception, match="3 checkpoint saves in a row failed"):
        run(cfg, lines, 8)
    (path,) = [p for p in tmp_path.iterdir() if p.name != path.name and not p.name.startswith(".")]
    s = json.loads((path / "summary.json").read_text())
    assert s["newest_checkpoint"].endswith("step-1")
    assert [p.name for p in (path / "checkpoints").iterdir()] == ["step-1"]  # no leftovers
    assert "final checkpoint failed" in s["checkpoint_errors"][-1]


def test_a_slow_restore_is_not_a_stall(tmp_path, monkeypatch):
    """The stall clock starts when the run starts (after the load), not when the pipeline
    is built: a load longer than rollout.stall_timeout_s is not 'no progress'."""
    import asyncio

    import rollart_sdk.control.pipeline as pipeline_module
    from rollart_sdk.control.pipeline import Pipeline

    # No first-episode budget here: the stall limit is stall_timeout_s from the start.
    monkeypatch.setattr(pipeline_module, "first_episode_s", lambda config: 0.0)
    cfg, lines = config(tmp_path)
    path = run(cfg, lines, 1).run_dir.path
    real = Pipeline.restore

    async def slow(self, ckpt, state):
        await asyncio.sleep(4)
        await real(self, ckpt, state)

    monkeypatch.setattr(Pipeline, "restore", slow)
    cfg, lines = config(tmp_path, "rollout.stall_timeout_s=3")
    run(cfg, lines, 2, resume=ResumePoint.prepare(cfg, path, 2))
    s = json.loads((path / "summary.json").read_text())
    assert s["error"] is None and s["steps"] == 2


def test_checkpoints_are_saved_by_time_by_default(tmp_path):
    """train.checkpoint_every_s (default 600) saves after the first step that ends that
    long after the last save; with a tiny interval, after every step; the newest
    keep_checkpoints stay. 0 turns it off (only the final save)."""
    from rollart_sdk.config import TrainConfig

    assert TrainConfig().checkpoint_every_s == 600 and TrainConfig().keep_checkpoints == 3
    cfg, lines = config(tmp_path, "train.checkpoint_every_s=0.001", "train.keep_checkpoints=2")
    job = run(cfg, lines, 4)
    assert [x for x in job.pipeline.log if x.startswith("checkpoint:")] == [
        f"checkpoint:{n}" for n in (1, 2, 3, 4)]
    assert sorted(p.name for p in job.run_dir.checkpoints.iterdir()) == ["step-3", "step-4"]
    cfg, lines = config(tmp_path, "train.checkpoint_every_s=0")
    job = run(cfg, lines, 2)
    assert [x for x in job.pipeline.log if x.startswith("checkpoint:")] == ["checkpoint:2"]


def test_finished_untrained_trajectories_are_carried_across_a_resume(tmp_path, monkeypatch):
    """Async: the trajectories finished and not trained when the run stopped (ready
    groups, a batch handed out but not trained) are in the checkpoint and trained after
    the resume, not redone; the accounting counts each once."""
    import time

    from rollart_trainer_torch.trainer import TorchTrainer

    from rollart_sdk.control.resume import read_carried

    real = TorchTrainer.train_step

    def slow(self, *a, **kw):  # rollout runs on meanwhile: groups finish and wait
        time.sleep(1.0)
        return real(self, *a, **kw)

    monkeypatch.setattr(TorchTrainer, "train_step", slow)
    cfg, lines = config(tmp_path)  # async, alpha 1
    first = run(cfg, lines, 2)
    path = first.run_dir.path
    s1 = json.loads((path / "summary.json").read_text())
    ckpt = newest_resumable(path)
    state = json.loads((ckpt / RUN_STATE).read_text())
    carried = read_carried(ckpt)
    assert carried and len(carried) == state["carried"], state
    assert len(carried) % cfg.rollout.group_size == 0  # whole groups
    assert all(t.reward is not None for t in carried)
    # Counted dropped (run_end) in the stopped session's summary; not in the checkpoint.
    assert s1["dropped"].get("run_end", 0) >= len(carried)
    assert state["dropped"].get("run_end", 0) == s1["dropped"]["run_end"] - len(carried)
    second = run(cfg, lines, 4, resume=ResumePoint.prepare(cfg, path, 4))
    trained = {t.trajectory_id for r in second.pipeline.records for t in r.batch}
    ids = {t.trajectory_id for t in carried}
    # Trained after the resume, except those the staleness bound evicts (started before
    # the first batch's floor: the restored version 2 - alpha 1), as it would have anyway.
    s2 = json.loads((path / "summary.json").read_text())
    late = [t for t in carried if t.trajectory_id not in trained]
    assert all(t.start_version < state["version"] - 1 for t in late), late
    assert len(ids & trained) >= cfg.rollout.batch_size
    assert s2["launched"] == s2["trained"] + sum(s2["dropped"].values())
    lost = (state["launched"] - state["trained"] - sum(state["dropped"].values())
            - state["carried"])
    assert s2["dropped"].get("resumed_in_flight", 0) == lost


def test_a_sync_run_stopped_and_resumed_ends_bit_identical(tmp_path):
    """Sync mode (every trained token from the version being trained): a run stopped
    after 2 of 4 steps and resumed ends with the same weights, bit for bit, and the same
    metrics (but for times and the env pools' per-session episode counters) as a run that
    was not stopped."""
    import torch
    from safetensors.torch import load_file

    def session(out, steps, resume_dir=None):
        cfg, lines = config(out, "rollout.mode=sync")
        resume = ResumePoint.prepare(cfg, resume_dir, steps) if resume_dir else None
        return run(cfg, lines, steps, resume=resume).run_dir.path

    whole = session(tmp_path / "a", 4)
    cut = session(tmp_path / "b", 2)
    assert session(tmp_path / "b", 4, cut) == cut
    wa = load_file(str(whole / "checkpoints" / "step-4" / "model.safetensors"))
    wb = load_file(str(cut / "checkpoints" / "step-4" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)

    def comparable(path):
        rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in m.items() if not (
            "time" in k or k.endswith("_s") or "_s/" in k or k.startswith("env/episodes/")
            or k in ("weight_sync/hidden_fraction",))} for m in rows]

    assert comparable(whole) == comparable(cut)


def test_a_run_whose_workers_cannot_start_leaves_no_run_directory(tmp_path, monkeypatch):
    """Reliability probe x2: `--address` to a cluster whose nodes lack the pools failed
    clearly but left an empty run directory behind. A new run's directory goes with the
    failure; a resumed run's directory is kept as it was."""
    from rollart_sdk.job import spawn

    cfg, lines = config(tmp_path)
    path = run(cfg, lines, 1).run_dir.path
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}

    def cannot_place(*a, **kw):  # what a cluster without the pools answers (Ray needed)
        raise RollartError("cannot place worker 'train-0': no alive node provides pool:H800")

    monkeypatch.setattr(spawn, "spawn_workers", cannot_place)
    with pytest.raises(RollartError, match="cannot place"):
        build_job(cfg, lines, in_process=True, log=lambda *a: None)
    assert [p for p in tmp_path.iterdir() if not p.name.startswith(".")] == [path]
    with pytest.raises(RollartError, match="cannot place"):
        build_job(cfg, lines, in_process=True, log=lambda *a: None,
                  resume=ResumePoint.prepare(cfg, path, 4))
    assert {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()} == before


def test_trajectories_carried_by_an_older_checkpoint_load_with_the_new_fields():
    """A checkpoint's carried trajectories are pickled; one written before a field was
    added (``earlier_segments``) loads with that field's default and trains."""
    import pickle

    from rollart_sdk.types import Trajectory, Turn

    old = Trajectory("t0", "task", "g0", 3, turns=[Turn([1, 2], [3], [-0.1], [3])], reward=1.0)
    del old.earlier_segments  # as the older class pickled it
    back = pickle.loads(pickle.dumps(old))
    assert back.earlier_segments == [] and back.generated_tokens == 1
    (sample,) = back.to_samples()
    assert sample.input_ids == [1, 2, 3] and sample.loss_mask == [0, 0, 1]
