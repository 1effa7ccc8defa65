"""Checkpoint folders and the run's files, without a run: published whole or not at all,
verified against their manifest, pruned to the newest K (never the one resumed from); the
metrics rollback and summary.json replaced atomically; the printed resume command."""

from __future__ import annotations

import argparse
import errno
import json
import shlex
import types
from pathlib import Path

import pytest

from rollart_sdk import durable
from rollart_sdk.control import checkpoints
from rollart_sdk.control.resume import find_loadable, rollback_metrics


def _save(root: Path, step: int, payload: bytes = b"weights") -> Path:
    partial = checkpoints.partial_dir(root, step)
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(payload * 100)
    (partial / "sub").mkdir()
    (partial / "sub" / "shard").write_bytes(b"s" * 10)
    return checkpoints.seal(partial, root, step, {"format": 1, "step": step, "version": step},
                            {"version": step, "reason": "periodic"})


def test_a_sealed_checkpoint_is_complete_and_verified(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    path = _save(root, 3)
    assert path == root / "step-3" and [p.name for p in root.iterdir()] == ["step-3"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.safetensors", "sub/shard", "run_state.json"}
    assert manifest["step"] == 3 and manifest["files"]["sub/shard"]["size"] == 10
    assert checkpoints.verify(checkpoints.complete(root)[0]) is None
    # A truncated file, a flipped byte, a missing file: each named in one line.
    model = path / "model.safetensors"
    good = model.read_bytes()
    model.write_bytes(good[:100])
    assert checkpoints.verify(path) == ("model.safetensors is 100 bytes, the manifest says "
                                        "700 (a torn or truncated file)")
    model.write_bytes(b"X" + good[1:])
    assert "does not match its SHA-256" in checkpoints.verify(path)
    assert checkpoints.verify(path, checksums=False) is None  # the size alone is right
    model.unlink()
    assert checkpoints.verify(path) == "model.safetensors is missing"
    (path / "run_state.json").write_text("{")
    assert checkpoints.verify(path).startswith("run_state.json unreadable")


def test_only_published_folders_count_and_the_newest_loadable_is_found(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        _save(root, step)
    # A cut save: a hidden folder (even with every file), or a step-N without manifest
    # that has no run state either: neither is a checkpoint.
    cut = checkpoints.partial_dir(root, 8)
    cut.mkdir()
    (cut / "run_state.json").write_text(json.dumps({"format": 1, "step": 8}))
    (root / "step-9").mkdir()
    # A legacy folder (written before manifests) with a run state still counts.
    (root / "final").mkdir()
    (root / "final" / "run_state.json").write_text(json.dumps({"format": 1, "step": 1}))
    found = checkpoints.complete(root)
    assert [(c.name, c.step, c.legacy) for c in found] == [
        ("step-6", 6, False), ("step-4", 4, False), ("step-2", 2, False), ("final", 1, True)]
    (root / "step-6" / "model.safetensors").write_bytes(b"torn")
    skipped: list[str] = []
    picked = find_loadable(found, skipped)
    assert picked is not None and picked[0].name == "step-4" and picked[1]["step"] == 4
    assert skipped == ["step-6: model.safetensors is 4 bytes, the manifest says 700 (a torn "
                       "or truncated file)"]


def test_prune_keeps_the_newest_k_and_the_one_resumed_from(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4, 5, 9):
        _save(root, step)
    (root / ".step-7.0123abcd.partial").mkdir()  # cut saves' leftovers
    (root / ".replaced-step-3-0123abcd").mkdir()
    removed = checkpoints.prune(root, keep=2, protect={root / "step-1"}, upto_step=5)
    # step-9 is past the step being saved (a resumed run replaces it when it gets there).
    assert sorted(p.name for p in root.iterdir()) == ["step-1", "step-4", "step-5", "step-9"]
    assert {p.name for p in removed} == {"step-2", "step-3", ".step-7.0123abcd.partial",
                                         ".replaced-step-3-0123abcd"}


def test_a_failed_write_leaves_the_previous_file_and_folder(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "summary.json"
    durable.write_text(f, '{"steps": 3}')
    real_open = open

    def full_disk(path, mode="r", *a, **kw):
        if "w" in mode:
            fh = real_open(path, mode, *a, **kw)
            fh.write("{\"ste")
            fh.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr("builtins.open", full_disk)
    with pytest.raises(OSError, match="No space"):
        durable.write_text(f, '{"steps": 4}')
    monkeypatch.undo()
    assert f.read_text() == '{"steps": 3}' and [p.name for p in tmp_path.iterdir()] == [f.name]
    # A folder: replaced whole, or (the body raised) left as it was.
    d = tmp_path / "final_model"
    with durable.new_dir(d) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError), durable.new_dir(d) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError("killed")
    assert (d / "a").read_text() == "1"
    with durable.new_dir(d) as tmp:
        (tmp / "b").write_text("3")
    assert [p.name for p in d.iterdir()] == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model", "summary.json"]


def test_metrics_rollback_is_atomic(tmp_path: Path, monkeypatch) -> None:
    lines = [json.dumps({"step": i}) for i in range(1, 6)] + ['{"step": 6, "wall_ti']
    (tmp_path / "metrics.jsonl").write_text("".join(x + "\n" for x in lines)[:-1])  # torn
    monkeypatch.setattr(durable, "write_text", lambda *a: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError):
        rollback_metrics(tmp_path, 3)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == lines  # untouched
    monkeypatch.undo()
    (tmp_path / "metrics.rolledback.jsonl").unlink()
    assert rollback_metrics(tmp_path, 3) == 3  # steps 4, 5 and the torn line
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == lines[:3]
    assert (tmp_path / "metrics.rolledback.jsonl").read_text().splitlines() == lines[3:]


def test_the_printed_resume_command_keeps_steps_address_and_quotes(tmp_path: Path) -> None:
    from rollart_sdk.cli.train import _how_to_resume

    run = tmp_path / "my run"
    _save(run / "checkpoints", 5)
    args = argparse.Namespace(
        config="cfg dir/base.yaml", address="10.0.0.1:6379",
        overrides=["tasks.0.reward.options={control: /tmp/x, log: /tmp/y}", "rollout.alpha=2"])
    job = types.SimpleNamespace(run_dir=types.SimpleNamespace(path=run))
    line = _how_to_resume(args, job, 60)
    head, command = line.split("; continue the run with: ")
    assert head == f"newest checkpoint: {run / 'checkpoints' / 'step-5'}"
    assert shlex.split(command) == [
        "rollart", "train", "cfg dir/base.yaml",
        "tasks.0.reward.options={control: /tmp/x, log: /tmp/y}", "rollout.alpha=2",
        "--steps", "60", "--address", "10.0.0.1:6379", "--resume", str(run)]
    args.address = None
    assert "--address" not in _how_to_resume(args, job, 60)


def test_error_texts_in_the_summary_are_plain():
    from rollart_sdk.job import plain

    coloured = "\x1b[36mray::TrainerWorker.train_step()\x1b[39m (pid=1, ip=127.0.0.1)\x1b[0m"
    assert plain(f"RayTaskError: {coloured}") == (
        "RayTaskError: ray::TrainerWorker.train_step() (pid=1, ip=127.0.0.1)")
