"""`rollart train` in both layouts (rollart_sdk/layout.py): the same run directory (metrics,
checkpoints, summary, samples), each recording which layout ran and why; a run of the
in-process layout resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from control_configs import two_tasks

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(1500)  # three runs; on Ray one took 4 min at load 25

# Small: one task, one engine, the ray transport (replaced by local in process).
CONFIG = two_tasks(
    name="layouts",
    roles={"actor_gen": {"workers": 1}},
    tasks=[two_tasks()["tasks"][0]],
    transport={"name": "ray"},
    train={"steps": 2, "bucket_mb": 1, "checkpoint_every": 1, "save_final_model": True},
)


def train(tmp_path: Path, *args: str) -> tuple[Path, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run(
        [sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg), "--no-progress",
         f"output_dir={tmp_path / 'runs'}", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("layouts")]
    return run, res.stdout


def files(run: Path) -> set[str]:
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()}


def test_both_layouts_write_the_same_run_directory_and_inprocess_resumes(tmp_path):
    ray_run, ray_out = train(tmp_path / "ray", "layout=ray")
    auto_run, auto_out = train(tmp_path / "auto")  # auto: one machine -> inprocess
    assert "layout: ray (set in the config)" in ray_out
    assert ("layout: inprocess (auto: one machine, every worker can share this process)"
            in auto_out)
    assert files(ray_run) == files(auto_run)
    for run, name in ((ray_run, "ray"), (auto_run, "inprocess")):
        assert json.loads((run / "plan.json").read_text())["layout"]["layout"] == name
        assert json.loads((run / "summary.json").read_text())["layout"]["layout"] == name
    ray_sum, auto_sum = (json.loads((r / "summary.json").read_text())
                         for r in (ray_run, auto_run))
    assert ray_sum.keys() == auto_sum.keys()
    assert auto_sum["layout"]["asked"] == "auto" and auto_sum["steps"] == 2
    for s in (ray_sum, auto_sum):
        assert s["launched"] == s["trained"] + sum(s["dropped"].values())
        assert s["error"] is None and s["checkpoint_errors"] == []
    ray_metrics, auto_metrics = ([json.loads(x) for x in (r / "metrics.jsonl").read_text()
                                  .splitlines()] for r in (ray_run, auto_run))
    assert [m["step"] for m in auto_metrics] == [1, 2]

    def keys(m: dict) -> set[str]:
        # env/reset_s/<tag> is there when an env instance was built since the last line,
        # which depends on timing (a CI run had it on the Ray run's step 2 only).
        return {k for k in m if not k.startswith("env/reset_s/")}

    assert [keys(m) for m in ray_metrics] == [keys(m) for m in auto_metrics]
    assert all("env/reset_s/FrozenLake" in ms[0] for ms in (ray_metrics, auto_metrics))
    # The in-process workers are objects of this process: the bindings say where each
    # would run (its pool), with no Ray node or placement group.
    bindings = json.loads((auto_run / "bindings.json").read_text())
    assert {b["role"] for b in bindings} >= {"actor_train", "actor_gen"}

    # Resume the in-process run for one more step, from its step-2 checkpoint.
    _, out = train(tmp_path / "auto", "--steps", "3", "--resume", str(auto_run))
    assert f"resumed from {auto_run / 'checkpoints' / 'step-2'} (2 steps done)" in out
    summary = json.loads((auto_run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["resumed_from"].endswith("step-2")
    assert [json.loads(x)["step"] for x in (auto_run / "metrics.jsonl").read_text()
            .splitlines()] == [1, 2, 3]
