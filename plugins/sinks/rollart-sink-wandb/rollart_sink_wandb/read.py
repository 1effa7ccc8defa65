"""Read back an offline W&B run: its ``run-<id>.wandb`` transaction log, each record
decoded with the ``wandb`` package's own protobuf message (``wandb_internal_pb2.Record``).

wandb 0.18+ has no Python reader of that file (``wandb sync`` reads it in its Go core),
so the record framing (LevelDB's log format with W&B's 7-byte file header: ``:W&B``,
magic, version; 32 KiB blocks; 7-byte record headers: crc32c, length, type) is read here.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def offline_runs(wandb_dir: str | Path) -> list[Path]:
    """The offline run folders under ``wandb_dir`` (the sink's ``dir``), oldest first."""
    root = Path(wandb_dir)
    root = root / "wandb" if (root / "wandb").is_dir() else root
    return sorted(root.glob("offline-run-*"))


def read_records(path: str | Path) -> list[Any]:
    """Every record of a ``.wandb`` file, as ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log (no ':W&B' header)")
    pos, out, buf = HEADER, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if pos + HEADER + length > len(data):
            break  # a record still being written: the file is read again later
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0:
            break
        buf = chunk if kind in (FULL, FIRST) else buf + chunk
        if kind in (FULL, LAST):
            # protobuf-generated: the stubs do not list it
            out.append(wandb_internal_pb2.Record.FromString(buf))  # type: ignore[attr-defined]
    return out


def finished_records(path: str | Path, wait_s: float = 30.0) -> list[Any]:
    """The records of a finished run's ``.wandb`` file: ``run.finish()`` returns before
    wandb's service process has written the file out, so it is read again (every 0.2 s,
    up to ``wait_s``) until it holds the run's ``exit`` record."""
    deadline = time.monotonic() + wait_s
    while True:
        records = read_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} has no exit record after {wait_s} s: the run was not "
                               "finished (run.finish()), or wandb's service is still writing")
        time.sleep(0.2)


def read_run(run_folder: str | Path, wait_s: float = 30.0) -> dict[str, Any]:
    """A finished offline run's ``history`` (step -> {key: value}) and ``config``."""
    files = sorted(Path(run_folder).glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_folder}")
    history: dict[int, dict[str, Any]] = {}
    config: dict[str, Any] = {}
    for rec in finished_records(files[0], wait_s):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                     for item in rec.history.item}
            # The step: its `_step` item (the record's own `step` field is not always set).
            step = int(items.get("_step", rec.history.step.num))
            history.setdefault(step, {}).update(items)
        elif kind == "config":
            for item in rec.config.update:
                config[item.key] = json.loads(item.value_json)
    return {"history": history, "config": config}
