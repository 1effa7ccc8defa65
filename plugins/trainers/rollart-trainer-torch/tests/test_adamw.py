"""LeanAdamW: torch.optim.AdamW's CPU update without torch.optim, bit for bit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from rollart_trainer_torch.adamw import LeanAdamW


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _train(opt_cls: type, steps: int, wd: float, state: dict | None = None,
           start: int = 0) -> tuple[torch.nn.Module, object]:
    m = _model()
    opt = opt_cls(list(m.parameters()), lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=wd)
    if state is not None:
        m.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    g = torch.Generator().manual_seed(1)
    for i in range(start + steps):
        x = torch.randn(4, 6, generator=g)
        if i < start:
            continue
        for group in opt.param_groups:
            group["lr"] = 3e-2 * (0.9 ** i)  # a schedule, as the trainer sets it
        m(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return m, opt


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_same_weights_and_state_as_torch_adamw(wd: float) -> None:
    ours, o1 = _train(LeanAdamW, 7, wd)
    theirs, o2 = _train(torch.optim.AdamW, 7, wd)
    start = _model().state_dict()
    for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert not torch.equal(a, start[k])  # trained
        assert torch.equal(a, b), k  # bit for bit
    s1, s2 = o1.state_dict(), o2.state_dict()  # type: ignore[attr-defined]
    assert s1["param_groups"] == s2["param_groups"]
    assert s1["state"].keys() == s2["state"].keys()
    for i in s1["state"]:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1["state"][i][name], s2["state"][i][name]), (i, name)


@pytest.mark.parametrize("first, second", [(LeanAdamW, torch.optim.AdamW),
                                           (torch.optim.AdamW, LeanAdamW)])
def test_state_dicts_move_between_the_two(first: type, second: type) -> None:
    """3 steps with one, the state handed to the other, 4 more: as 7 with torch's."""
    m, opt = _train(first, 3, 0.1)
    state = {"model": m.state_dict(), "opt": opt.state_dict()}  # type: ignore[attr-defined]
    resumed, _ = _train(second, 4, 0.1, state, start=3)
    straight, _ = _train(torch.optim.AdamW, 7, 0.1)
    for a, b in zip(resumed.state_dict().values(), straight.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_mismatched_state_and_gpu_parameters_are_refused() -> None:
    opt = LeanAdamW(_model().parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                    weight_decay=0.0)
    other = LeanAdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-3, betas=(0.9, 0.999),
                      eps=1e-8, weight_decay=0.0)
    with pytest.raises(ValueError, match="other parameter groups"):
        opt.load_state_dict(other.state_dict())
    meta = torch.nn.Parameter(torch.zeros(2, device="meta"))
    with pytest.raises(ValueError, match="CPU parameters"):
        LeanAdamW([meta], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def test_a_step_does_not_import_torch_dynamo() -> None:
    code = ("import sys, torch; from rollart_trainer_torch.adamw import LeanAdamW; "
            "m = torch.nn.Linear(3, 2); o = LeanAdamW(m.parameters(), 1e-3, (0.9, 0.999), "
            "1e-8, 0.0); m(torch.ones(1, 3)).sum().backward(); o.step(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "False"


def test_denominator_written_in_place_bit_for_bit_over_dtypes_and_layouts() -> None:
    """The update's denominator goes into one reused buffer per dtype (no parameter-sized
    temporaries a step) and the weights stay torch's bit for bit: float32 and bfloat16
    parameters of different sizes, and a non-contiguous one (its own buffer)."""
    def params() -> list[torch.nn.Parameter]:
        g = torch.Generator().manual_seed(3)
        big = torch.randn(40, 30, generator=g)
        return [torch.nn.Parameter(big.clone()),
                torch.nn.Parameter(torch.randn(7, generator=g)),
                torch.nn.Parameter(torch.randn(12, 5, generator=g).to(torch.bfloat16)),
                torch.nn.Parameter(torch.randn(8, 6, generator=g).t())]  # non-contiguous

    ours, theirs = params(), params()
    assert not ours[3].is_contiguous()
    o1 = LeanAdamW(ours, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    o2 = torch.optim.AdamW(theirs, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    g = torch.Generator().manual_seed(4)
    buffers = []
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g).to(p.dtype) for p in ours]
        for p, q, gr in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        o1.step()
        o2.step()
        buffers.append({d: t.data_ptr() for d, t in o1._scratch.items()})
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    assert set(buffers[0]) == {torch.float32, torch.bfloat16}
    assert buffers[0] == buffers[1] == buffers[2]  # the same buffers every step
    assert o1._scratch[torch.float32].numel() == 40 * 30  # the largest float32 parameter
