"""Chaos: the training process is SIGKILLed five times at chosen points (inside a train
step, inside the trainer's checkpoint write, during rollout), and resumed each time.

The run completes its steps; after every kill each complete checkpoint passes its
manifest and the resume loads the newest one; at most one checkpoint interval of steps is
redone per kill; the accounting balances over all segments; the metrics continue.

The process is the in-process job (the real torch engine, trainer and envs; no Ray) in a
subprocess, so that one SIGKILL takes the trainer down in the middle of its write too:
harsher than killing a driver whose trainer lives on in a Ray actor. Marker files written
by the script (``TRAIN``, ``SAVE``: a train step or a checkpoint write in progress, each
held open 0.3 s) let the test kill inside them. Bounded: each segment has a timeout, the
kills are counted, the whole test takes about a minute on two cores.

``resumes`` in summary.json counts the sessions in the lineage of the checkpoint the run
ended on: a session killed before its first save leaves no trace, so it may be below 5.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from control_configs import two_tasks

from rollart_sdk.control import checkpoints

pytestmark = pytest.mark.timeout(600)

STEPS = 10
EVERY = 1  # train.checkpoint_every: the interval a kill may cost
SCRIPT = r"""
import sys, time
from pathlib import Path
import rollart_trainer_torch.checkpoint as ckpt_io
from rollart_trainer_torch.trainer import TorchTrainer
from rollart_sdk.config import load_config
from rollart_sdk.job import ResumePoint, build_job, run_job

marks = Path(sys.argv[2])
real_step, real_save_file = TorchTrainer.train_step, ckpt_io.save_file

def held(name, fn, *a, **kw):
    (marks / name).touch()
    try:
        time.sleep(0.3)  # a window to be killed in
        return fn(*a, **kw)
    finally:
        (marks / name).unlink(missing_ok=True)

# Inside the trainer's checkpoint write: the model file is written, the optimiser not yet.
ckpt_io.save_file = lambda *a, **kw: held("SAVE", real_save_file, *a, **kw)
TorchTrainer.train_step = lambda self, *a, **kw: held("TRAIN", real_step, self, *a, **kw)
cfg, lines = load_config(sys.argv[1])
resume = ResumePoint.prepare(cfg, sys.argv[3], cfg.train.steps) if len(sys.argv) > 3 else None
job = build_job(cfg, lines, in_process=True, log=print, resume=resume)
try:
    run_job(job, cfg.train.steps, progress=False)
finally:
    job.close()
print("done", flush=True)
"""


def _lines(run: Path) -> int:
    f = run / "metrics.jsonl"
    return len(f.read_text().splitlines()) if f.is_file() else 0


def _start(cfg: Path, marks: Path, run: Path | None, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [sys.executable, "-c", SCRIPT, str(cfg), str(marks), *([str(run)] if run else [])]
    return subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                            cwd=Path(__file__).parent)


def _kill_at(proc: subprocess.Popen[bytes], point: str, marks: Path, run_of, after: int,
             rng: random.Random, timeout: float = 120) -> tuple[bool, int]:
    """SIGKILL ``proc`` at ``point`` once its run has more than ``after`` metrics lines;
    ``(killed, metrics lines at the kill)``. False when the run ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False, 0
        run = run_of()
        if run is not None and _lines(run) > after:
            ready = {"train": (marks / "TRAIN").exists(), "save": (marks / "SAVE").exists(),
                     "rollout": not (marks / "TRAIN").exists()}[point]
            if ready:
                if point == "rollout":
                    time.sleep(rng.uniform(0.0, 0.2))
                lines = _lines(run)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=60)
                return True, lines
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"no {point} point within {timeout}s")


def test_sigkill_five_times_and_resume_each_time(tmp_path: Path) -> None:
    rng = random.Random(0)
    out = tmp_path / "runs"
    config = two_tasks(name="chaos", train={"steps": STEPS, "bucket_mb": 1,
                                            "checkpoint_every": EVERY, "save_final_model": False})
    config["output_dir"] = str(out)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config))
    marks = tmp_path / "marks"
    marks.mkdir()

    def run_of() -> Path | None:
        found = [p for p in out.iterdir() if p.name.startswith("chaos")] if out.exists() else []
        return found[0] if found else None

    run: Path | None = None
    kills: list[tuple[str, int, int]] = []  # (point, lines at the kill, newest step after)
    for i, point in enumerate(["train", "save", "rollout", "save", "train"]):
        for m in marks.iterdir():
            m.unlink()
        log = tmp_path / f"seg{i}.log"
        proc = _start(cfg, marks, run, log)
        killed, lines = _kill_at(proc, point, marks, run_of, _lines(run) if run else 0, rng)
        assert killed, f"segment {i} ended before its kill:\n{log.read_text()[-3000:]}"
        run = run_of()
        assert run is not None
        found = checkpoints.complete(run / "checkpoints")
        assert found, f"no checkpoint after kill {i} ({point})"
        # No checkpoint is ever unloadable: every complete one passes its manifest.
        for c in found:
            assert checkpoints.verify(c) is None, (point, c.name, checkpoints.verify(c))
        # At most one interval of trained steps is lost (+1: the step being saved).
        assert found[0].step >= lines - EVERY, (point, lines, [c.name for c in found])
        kills.append((point, lines, found[0].step))
    assert run is not None
    log = tmp_path / "last.log"
    proc = _start(cfg, marks, run, log)
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0 and "done" in text, text[-3000:]
    for i in range(len(kills)):
        seg = (tmp_path / f"seg{i}.log").read_text() if i else ""
        assert "skipped" not in seg, seg  # the newest checkpoint was always loadable
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), kills
    rolled = (run / "metrics.rolledback.jsonl")
    redone = len(rolled.read_text().splitlines()) if rolled.exists() else 0
    assert redone <= len(kills) * EVERY, (redone, kills)
    summary = json.loads((run / "summary.json").read_text())
    # resumes counts the sessions in the final checkpoint's lineage: a session killed
    # before its first save (its metrics line written, its save cut) leaves no trace.
    assert summary["steps"] == STEPS and 1 <= summary["resumes"] <= len(kills), summary
    assert summary["error"] is None
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    assert summary["trained"] == STEPS * config["rollout"]["batch_size"]
    # Only complete checkpoints are left: the newest keep_checkpoints (3) and the one the
    # last segment resumed from (never touched by the session that resumed from it).
    names = {p.name for p in (run / "checkpoints").iterdir()}
    resumed_from = Path(summary["resumed_from"]).name
    assert names == {f"step-{s}" for s in range(STEPS - 2, STEPS + 1)} | {resumed_from}, names
    print(f"kills (point, metrics lines at the kill, newest checkpoint after): {kills}; "
          f"steps redone: {redone}")
