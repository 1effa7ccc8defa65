"""The run's checkpoint folders: written so that none is ever lost or half-written.

Layout: ``RUN/checkpoints/step-N/`` for ``N`` steps trained, one folder per save (periodic
or final), each holding the trainer's own files, ``run_state.json`` (the control plane's
side, :mod:`rollart_sdk.control.resume`) and ``manifest.json``: every file's size and
SHA-256, written last.

A save (:func:`seal`, after the trainer ranks wrote into a fresh hidden folder
``checkpoints/.step-N.<id>.partial``):

1. ``run_state.json`` then ``manifest.json`` are written into the hidden folder;
2. every file and the folder are fsynced;
3. the folder is renamed to ``step-N`` (atomic) and ``checkpoints/`` is fsynced;
4. older checkpoints are pruned: the newest ``train.keep_checkpoints`` stay, and the
   one the run resumed from is never touched.

A kill at any point leaves either no ``step-N`` or a complete one; a failed save (disk
full, permission) leaves the earlier checkpoints as they were. ``--resume`` verifies a
checkpoint against its manifest (:func:`verify`) before loading it, and falls back to the
next newest complete one when it does not pass.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart_sdk import durable

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
RUN_STATE = "run_state.json"  # also rollart_sdk.control.resume.RUN_STATE
_STEP = re.compile(r"^step-(\d+)$")
# Checkpoints of the first sessions had a folder "final" and no manifest: still resumable.
_LEGACY = re.compile(r"^(step-\d+|final)$")


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint folder (``legacy``: written before manifests, unverifiable)."""

    path: Path
    step: int
    legacy: bool = False

    @property
    def name(self) -> str:
        return self.path.name


def step_name(step: int) -> str:
    return f"step-{step}"


def partial_dir(root: str | Path, step: int) -> Path:
    """A fresh hidden folder for the trainer ranks to write the checkpoint of ``step`` into."""
    return Path(root) / f".{step_name(step)}.{uuid.uuid4().hex[:8]}.partial"


def complete(root: str | Path) -> list[Checkpoint]:
    """The complete checkpoints under ``root`` (``RUN/checkpoints``), newest first (most
    steps; on a tie, most recently written). Complete: published (a visible ``step-N``)
    with its manifest; or a legacy folder with ``run_state.json``."""
    root = Path(root)
    if not root.is_dir():
        return []
    found: list[tuple[int, float, Checkpoint]] = []
    for d in root.iterdir():
        if d.name.startswith(".") or not d.is_dir():
            continue
        m = _STEP.match(d.name)
        if m and (d / MANIFEST).is_file():
            found.append((int(m.group(1)), (d / MANIFEST).stat().st_mtime,
                          Checkpoint(d, int(m.group(1)))))
        elif _LEGACY.match(d.name) and (d / RUN_STATE).is_file():
            try:
                step = int(json.loads((d / RUN_STATE).read_text())["step"])
            except (ValueError, KeyError, TypeError, OSError):
                continue
            found.append((step, (d / RUN_STATE).stat().st_mtime, Checkpoint(d, step, legacy=True)))
    found.sort(key=lambda x: (x[0], x[1]), reverse=True)
    return [c for _, _, c in found]


def sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``manifest.json`` of ``folder``: ``meta`` and every other file's size and SHA-256."""
    manifest = {
        "format": MANIFEST_FORMAT,
        **meta,
        "written_at": time.time(),
        "files": {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256(p)}
                  for p in _files(folder)},
    }
    durable.write_text(folder / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def verify(ckpt: Checkpoint | Path, checksums: bool = True) -> str | None:
    """Why checkpoint ``ckpt`` cannot be loaded (one line), or None when every file the
    manifest lists is there with its size (and SHA-256, ``checksums``)."""
    path = ckpt.path if isinstance(ckpt, Checkpoint) else Path(ckpt)
    state = path / RUN_STATE
    try:
        json.loads(state.read_text())
    except (OSError, ValueError) as exc:
        return f"{RUN_STATE} unreadable ({type(exc).__name__}: {exc})"[:300]
    if isinstance(ckpt, Checkpoint) and ckpt.legacy:
        return None  # nothing to check it against (the trainer's load still checks)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} unreadable ({type(exc).__name__}: {exc})"[:300]
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"{MANIFEST} has format {manifest.get('format')!r}; this version reads {MANIFEST_FORMAT}"
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        size = f.stat().st_size
        if size != want["size"]:
            return (f"{rel} is {size:,} bytes, the manifest says {want['size']:,} (a torn or "
                    "truncated file)")
        if checksums and sha256(f) != want["sha256"]:
            return f"{rel} does not match its SHA-256 in the manifest (the file was changed or corrupted)"
    return None


def seal(partial: Path, root: Path, step: int, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Publish the trainer's files in ``partial`` as ``root/step-N``: ``run_state.json``
    (``state``), the manifest, fsync, atomic rename (see the module doc). Blocking (reads
    every file for its checksum): run it off the event loop."""
    durable.write_text(partial / RUN_STATE, json.dumps(state, indent=1))
    write_manifest(partial, {"step": step, **meta})
    durable.fsync_tree(partial)
    final = Path(root) / step_name(step)
    durable.replace_dir(partial, final)
    return final


def prune(root: str | Path, keep: int, protect: set[Path], upto_step: int,
          busy: set[Path] | None = None) -> list[Path]:
    """Remove the complete checkpoints older than the newest ``keep`` among those of at
    most ``upto_step`` steps, except ``protect`` (the one the run resumed from), and the
    hidden leftovers of saves that were cut (except ``busy``: saves in progress). A
    checkpoint past ``upto_step`` is left alone (a resumed run replaces it when it gets
    there). Returns the folders removed."""
    root = Path(root)
    removed: list[Path] = []
    protect = {p.resolve() for p in protect}
    busy = {p.resolve() for p in (busy or set())}
    kept = 0
    for c in complete(root):
        if c.step > upto_step:
            continue
        if kept < keep:
            kept += 1
            continue
        if c.path.resolve() in protect:
            continue
        shutil.rmtree(c.path, ignore_errors=True)
        removed.append(c.path)
    for d in root.iterdir() if root.is_dir() else []:
        leftover = d.name.startswith(".") and (d.name.endswith(".partial")
                                              or d.name.startswith(".replaced-"))
        if leftover and d.resolve() not in busy:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    if removed:
        durable.fsync_dir(root)
    return removed
