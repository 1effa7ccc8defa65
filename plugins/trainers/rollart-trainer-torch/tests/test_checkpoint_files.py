"""The torch trainer's checkpoint folder: never half-written, generic over the optimiser.

A save that fails part-way (a full disk) leaves the earlier checkpoint under the name as
it was and no hidden leftover; whatever the optimiser's ``state_dict`` holds (per-parameter
tensors such as fp32 master weights, top-level entries) comes back on load.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import torch
from rollart_trainer_torch import checkpoint

torch.set_num_threads(1)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _step(model: torch.nn.Module, opt: Any) -> None:
    loss = model(torch.ones(2, 4)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


class MasterAdamW(torch.optim.AdamW):
    """AdamW whose state_dict also holds an fp32 master copy per parameter and a
    top-level entry with tensors and scalars (what a mixed-precision optimiser adds)."""

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
        self.loss_scale = {"scale": torch.tensor(1024.0), "growth": 2, "history": [1.0, 2.0]}

    def step(self, closure: Any = None) -> Any:
        out = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["master"] = p.detach().to(torch.float64) + 0.5
        self.loss_scale["scale"] = self.loss_scale["scale"] * 2
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "loss_scale": self.loss_scale}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        self.loss_scale = state_dict.pop("loss_scale")
        super().load_state_dict(state_dict)


def test_any_optimizer_state_round_trips(tmp_path: Path) -> None:
    model = _model(0)
    opt = MasterAdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        _step(model, opt)
    checkpoint.write(tmp_path / "ck", model, opt, {"version": 2, "step": 2})
    model2 = _model(1)
    opt2 = MasterAdamW(model2.parameters(), lr=1e-2)
    state = checkpoint.read(tmp_path / "ck", model2, opt2, "cpu", "tiny")
    assert state["version"] == 2
    a, b = opt.state_dict(), opt2.state_dict()
    for pid, st in a["state"].items():
        for name, value in st.items():
            assert torch.equal(value, b["state"][pid][name]), (pid, name)
            assert value.dtype == b["state"][pid][name].dtype
    assert torch.equal(b["loss_scale"]["scale"], torch.tensor(4096.0))
    assert b["loss_scale"]["growth"] == 2 and b["loss_scale"]["history"] == [1.0, 2.0]
    # The next step is the same as the saving optimiser's.
    _step(model, opt)
    _step(model2, opt2)
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_failed_save_leaves_the_earlier_checkpoint(tmp_path: Path, monkeypatch) -> None:
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt)
    out = tmp_path / "ck"
    checkpoint.write(out, model, opt, {"version": 1, "step": 1})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _step(model, opt)
    calls = {"n": 0}
    real = checkpoint.save_file

    def full_disk(tensors: Any, path: str, *a: Any, **kw: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the RNG file: model and optimiser were written already
            Path(path).write_bytes(b"x" * 10)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tensors, path, *a, **kw)

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.write(out, model, opt, {"version": 2, "step": 2})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no leftover
    monkeypatch.setattr(checkpoint, "save_file", real)
    # It still loads, as the step-1 state; and a later save replaces it whole.
    assert checkpoint.read(out, _model(3), torch.optim.AdamW(_model(3).parameters()),
                           "cpu", "tiny")["version"] == 1
    checkpoint.write(out, model, opt, {"version": 2, "step": 2})
    assert checkpoint.read(out, _model(3), torch.optim.AdamW(_model(3).parameters()),
                           "cpu", "tiny")["version"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
