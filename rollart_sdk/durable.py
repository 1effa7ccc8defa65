"""Durable writes: a file or a folder appears whole under its name, or not at all.

A crash (kill -9, OOM, power loss) or a full disk in the middle of a write leaves the
previous version under the name, never a torn one: the new content is written under a
temporary name beside it, fsynced, then renamed over the name (``os.replace`` is atomic
on POSIX file systems), and the parent folder is fsynced so that the rename survives a
power loss too. Used for checkpoints (:mod:`rollart_sdk.control.checkpoints`, the
trainers' ``checkpoint.py``), ``summary.json`` and ``metrics.jsonl`` rewrites.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """Make the entries of folder ``path`` (names created, renamed, removed) durable."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:  # e.g. a platform without directory file descriptors
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder: nothing more to do
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_tree(path: str | Path) -> None:
    """fsync every file and folder under ``path`` (files written by another process
    too: fsync flushes the file, whoever wrote it)."""
    root = Path(path)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fsync_file(Path(dirpath) / name)
        fsync_dir(dirpath)


def write_text(path: str | Path, text: str) -> None:
    """Replace file ``path`` with ``text`` atomically (a reader sees the old or the new
    content, never a part). On an error (disk full) the old file is left as it was."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(out.parent)


def replace_dir(src: str | Path, dst: str | Path) -> None:
    """Put the (complete, fsynced) folder ``src`` under the name ``dst``. A folder already
    named ``dst`` is moved aside first and removed after: at every instant ``dst`` is
    either the old folder, absent (the old one then lies beside it as ``.replaced-*``), or
    the new one; never a mix."""
    src, dst = Path(src), Path(dst)
    aside = None
    if dst.exists():
        aside = dst.with_name(f".replaced-{dst.name}-{uuid.uuid4().hex[:8]}")
        os.replace(dst, aside)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def partial_name(path: str | Path) -> Path:
    """The temporary folder a save of ``path`` writes into: beside it, hidden."""
    p = Path(path)
    return p.with_name(f".{p.name}.partial")


@contextlib.contextmanager
def new_dir(path: str | Path) -> Iterator[Path]:
    """Write a folder that appears under ``path`` only when complete::

        with new_dir(out) as tmp:
            save_file(..., tmp / "model.safetensors")

    The body writes into a fresh temporary folder beside ``path``; when it returns, every
    file is fsynced and the folder replaces ``path`` (:func:`replace_dir`). When it raises
    (a full disk, a killed save), the temporary folder is removed and ``path`` is
    untouched."""
    tmp = partial_name(path)
    shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_tree(tmp)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
