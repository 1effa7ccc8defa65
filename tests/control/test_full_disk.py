"""A checkpoint save on a really full filesystem (a small tmpfs, mounted for the test).

The run writes to a tmpfs; before its third save the filesystem is filled (a filler file
until ENOSPC, leaving a little room for the metrics lines), so the trainer's own write
fails with the kernel's ENOSPC, not a simulated one. What must hold: one line per failed
save naming the error and the checkpoint that stays the newest; the run stops by its rule
(3 failed saves in a row) with that checkpoint intact (it passes its manifest) and nothing
half-written left in ``checkpoints/``; ``metrics.jsonl`` and ``summary.json`` parse; and
once space is freed, ``--resume`` takes that checkpoint and finishes the run.

Needs root and a kernel that lets this process mount a tmpfs (true on CI); skipped with
the reason where mounting is not allowed.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
from control_configs import two_tasks

from rollart_sdk.config import load_config
from rollart_sdk.control import checkpoints
from rollart_sdk.job import ResumePoint, build_job, run_job

pytestmark = pytest.mark.timeout(600)

SIZE_MB = 48  # the tmpfs: the run's files and a few tiny-model checkpoints fit
ROOM_KB = 256  # left free after the fill: metrics lines fit, a checkpoint does not
FULL_AT = 3  # the save (step count) before which the disk is filled


def _mount_tmpfs(where: Path) -> str | None:
    """Mount a SIZE_MB tmpfs at ``where``; None, or why it could not be mounted."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    where.mkdir(parents=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(where)],
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        return f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}"
    return None


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "disk"
    why = _mount_tmpfs(where)
    if why:
        pytest.skip(f"{why} (the full-disk test needs a real small filesystem)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` up to ROOM_KB of free space; the filler's path."""
    reserve, filler = disk / "reserve", disk / "filler"
    reserve.write_bytes(b"\0" * (ROOM_KB << 10))
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            chunk = b""  # what did not fit is dropped; close must not flush it again
            f.truncate(f.tell())
    reserve.unlink()
    return filler


def _run(cfg, lines, steps, said, resume=None):
    job = build_job(cfg, lines, in_process=True, log=said.append, resume=resume)
    try:
        run_job(job, steps, progress=False)
    finally:
        job.close()
    return job


def test_a_save_on_a_full_disk_keeps_the_previous_checkpoint_and_resume_uses_it(
        small_disk, monkeypatch):
    import rollart_trainer_torch.checkpoint as torch_ckpt

    # A model whose checkpoint (about 0.9 MB) is well over the room left after the fill.
    data = two_tasks(model={"tiny": {"hidden_size": 64, "num_layers": 1, "num_heads": 2,
                                     "intermediate_size": 128}},
                     train={"steps": 8, "bucket_mb": 1, "save_final_model": False,
                            "checkpoint_every": 1, "samples_per_task": 0})
    out = small_disk / "runs"
    cfg, lines = load_config(data=copy.deepcopy(data), overrides=[f"output_dir={out}"])
    real = torch_ckpt.write
    filled: list[Path] = []

    def write(path, model, opt, meta, **kw):
        if meta["version"] >= FULL_AT and not filled:
            filled.append(_fill(small_disk))  # the disk fills up while the run goes on
        real(path, model, opt, meta, **kw)

    monkeypatch.setattr(torch_ckpt, "write", write)
    said: list[str] = []
    with pytest.raises(Exception, match="3 checkpoint saves in a row failed") as info:
        _run(cfg, lines, 8, said)
    assert "No space left on device" in str(info.value)
    (run,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    newest = f"step-{FULL_AT - 1}"
    # One line per failed save: the kernel's error and the checkpoint that stays.
    failed = [s for s in said if "checkpoint step-" in s and " failed: " in s]
    assert len(failed) == 3, said
    for n, line in enumerate(failed, 1):
        assert "\n" not in line, line
        assert "No space left on device" in line, line  # the kernel's ENOSPC, as the writer says it
        assert f"; {newest} stays the newest ({n} in a row; the run stops at 3)" in line, line
    # The previous checkpoints are as they were, and nothing half-written is left.
    ckpts = run / "checkpoints"
    size = sum(f.stat().st_size for f in (ckpts / "step-1").iterdir())
    assert size > 2 * (ROOM_KB << 10), size  # the premise: a save cannot fit in the room
    assert sorted(p.name for p in ckpts.iterdir()) == [f"step-{s}" for s in range(1, FULL_AT)]
    assert all(checkpoints.verify(c) is None for c in checkpoints.complete(ckpts))
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps_done = [m["step"] for m in metrics]
    assert steps_done == list(range(1, len(steps_done) + 1)) and len(steps_done) >= FULL_AT
    summary = json.loads((run / "summary.json").read_text())  # written whole, or not at all
    assert "3 checkpoint saves in a row failed" in summary["error"]
    assert summary["newest_checkpoint"].endswith(newest)

    # Space freed: --resume takes the checkpoint kept and finishes the run.
    filled[0].unlink()
    monkeypatch.setattr(torch_ckpt, "write", real)
    said.clear()
    resume = ResumePoint.prepare(cfg, run, 8)
    assert Path(resume.checkpoint).name == newest
    job = _run(cfg, lines, 8, said, resume=resume)
    assert job.pipeline.log[0] == f"restore:{FULL_AT - 1}"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["error"] is None and summary["steps"] == 8
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    assert all(checkpoints.verify(c) is None for c in checkpoints.complete(ckpts))
