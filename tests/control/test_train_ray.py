"""`rollart train` for real: a subprocess, a local Ray, workers bound to pools, a run dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from control_configs import two_tasks

ROOT = Path(__file__).resolve().parents[2]

CONFIG = two_tasks(
    name="ray-e2e",
    pools=[
        {"name": "H800", "hardware": "H800", "kind": "gpu", "profile": "compute", "count": 2},
        {"name": "H20", "hardware": "H20", "kind": "gpu", "profile": "bandwidth", "count": 2},
        {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 4},
    ],
    transport={"name": "ray"},
    train={"steps": 3, "bucket_mb": 1, "checkpoint_every": 2},
    layout="ray",  # auto would run this one-machine config in process
)

REQUIRED = ["step", "wall_time", "reward/FrozenLake", "reward/Arithmetic", "staleness/max",
            "trajectories/trained", "trajectories/dropped", "time/get_batch_wait", "time/train",
            "time/weight_sync"]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    return env


def train(tmp_path: Path, data: dict) -> Path:
    """``rollart train`` on ``data`` in a subprocess (a local Ray); its run directory."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    res = subprocess.run(
        [sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg), "--no-progress",
         f"output_dir={tmp_path / 'runs'}"],
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith(data["name"])]
    return run


def test_rollart_train_on_ray_writes_a_run_directory(tmp_path):
    run = train(tmp_path, CONFIG)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for key in REQUIRED:
        assert all(key in m for m in metrics), key
    assert max(m["staleness/max"] for m in metrics) <= 1
    summary = json.loads((run / "summary.json").read_text())
    # Every task's generation ran only on the engine bound to its affinity pool.
    bindings = {b["worker"]: b for b in json.loads((run / "bindings.json").read_text())}
    assert {key.split("@")[0] for key in summary["served"]} == {"FrozenLake", "Arithmetic"}
    for key in summary["served"]:
        tag, worker = key.split("@")
        assert bindings[worker]["pool"] == {"FrozenLake": "H800", "Arithmetic": "H20"}[tag]
    roles = {b["role"]: b["pool"] for b in bindings.values()}
    assert roles["environment"] == "cpu" and roles["actor_train"] == "H800"
    # Weights went through the Ray transport to both engines at every update.
    assert {u["version"] for u in summary["weight_updates"]} == {1, 2}
    assert summary["launched"] == summary["trajectories_trained"] + sum(summary["dropped"].values())
    # Checkpoints: periodic and final; the final model loads with transformers.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-3"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "final_model")
    events = (run / "events.jsonl").read_text().splitlines()
    spans = {json.loads(e)["span"] for e in events}
    assert {"generate", "env_reset", "env_step", "reward", "train", "weight_sync"} <= spans
    # The report draws both figures.
    rep = subprocess.run([sys.executable, "-m", "rollart_sdk.cli", "report", str(run)],
                         capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert (run / "rewards.png").stat().st_size > 10_000
    assert (run / "timeline.png").stat().st_size > 10_000


def test_streamed_sync_steps_reach_a_trainer_actor_on_ray(tmp_path):
    """train.stream_groups true on the Ray layout: the groups that complete first go to
    the trainer actor's accumulate (through the object store, as train_step's shards do),
    the last one to train_step; each step trains its whole batch once."""
    data = dict(CONFIG, name="ray-stream", rollout={**CONFIG["rollout"], "mode": "sync"},
                train={"steps": 3, "bucket_mb": 1, "stream_groups": True})
    run = train(tmp_path, data)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # Arithmetic's one-turn group completes before FrozenLake's: two parts a step.
    assert max(m["train/parts"] for m in metrics) >= 2, [m["train/parts"] for m in metrics]
    assert all(m["train/sequences"] == 8 and "time/batch_spread" in m for m in metrics)
    assert any(m.get("time/train_accumulate", 0) > 0 for m in metrics)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    assert summary["trained"] == 24
