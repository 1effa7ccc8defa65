"""Trainer ``megatron``'s checkpoint save is atomic, checked without Megatron installed.

Megatron's writer is replaced by a stand-in that writes one file per rank (world size 1,
gloo): the folder appears under its name only complete; a save that fails part-way leaves
the earlier one as it was and no hidden leftover. The same with the real writer:
``test_megatron_trainer.py::test_a_failed_save_leaves_the_earlier_checkpoint``.
"""

from __future__ import annotations

import errno
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from rollart_trainer_megatron import checkpoint


class _Opts:
    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return {}


class _Trainer:
    rank, tp, pp, world_size, _step = 0, 1, 1, 1, 0

    def __init__(self, version: int) -> None:
        self.version = version
        self.optimizer = types.SimpleNamespace(param_groups=[{"lr": 1e-3, "params": []}],
                                               main_params=[], state={}, loss_scale=1.0,
                                               scaler=None)
        self.master_weights = False
        self.params = [torch.zeros(1)]
        self.options = types.SimpleNamespace(use_distributed_optimizer=False)
        self.options.model_dump = _Opts().model_dump  # type: ignore[attr-defined]
        self.named_params: dict[str, torch.Tensor] = {}


@pytest.fixture
def fake_megatron(monkeypatch, tmp_path):
    calls: dict[str, Any] = {"fail": False}

    def save(state: Any, path: str) -> None:
        (Path(path) / "shard0").write_bytes(b"w" * 64)
        if calls["fail"]:
            raise OSError(errno.ENOSPC, "No space left on device")

    core = types.ModuleType("megatron.core")
    core.dist_checkpointing = types.SimpleNamespace(save=save)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
    monkeypatch.setitem(sys.modules, "megatron.core", core)
    monkeypatch.setattr(checkpoint, "_sharded_state", lambda trainer, moments: {})
    monkeypatch.setattr(checkpoint, "_moments", lambda trainer: {})
    ours = not dist.is_initialized()  # another test's group (world size 1) serves as well
    if ours:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}",
                                rank=0, world_size=1)
    yield calls
    if ours:
        dist.destroy_process_group()


def test_a_failed_save_leaves_the_earlier_checkpoint(tmp_path: Path, fake_megatron) -> None:
    root = tmp_path / "ckpts"
    root.mkdir()
    out = root / "ck"
    checkpoint.save(_Trainer(1), str(out))
    assert json.loads((out / "trainer_state.json").read_text())["version"] == 1
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    fake_megatron["fail"] = True
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(_Trainer(2), str(out))
    after = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in root.iterdir()] == ["ck"]  # no hidden leftover
    fake_megatron["fail"] = False
    checkpoint.save(_Trainer(2), str(out))  # replaced whole
    assert json.loads((out / "trainer_state.json").read_text())["version"] == 2
    assert [p.name for p in root.iterdir()] == ["ck"]
