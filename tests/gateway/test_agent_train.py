"""examples/agent_calc.yaml trains in-process: the built-in env ``agent`` runs the example's
plain ``openai`` loop through the gateway, the pipeline completes its steps and counts every
episode (on Ray: ``rollart train examples/agent_calc.yaml``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("openai")

from rollart_sdk.config import load_config
from rollart_sdk.job import build_job, run_job

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def test_example_agent_trains_in_process(tmp_path: Path) -> None:
    cfg, lines = load_config(ROOT / "examples" / "agent_calc.yaml",
                             overrides=[f"output_dir={tmp_path}", "train.steps=2",
                                        "transport.name=local"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        records = run_job(job, 2, progress=False)
    finally:
        job.close()
    assert len(records) == 2
    p = job.pipeline
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
    assert p.buffer.trained >= 2 * cfg.rollout.batch_size
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir() and not d.name.startswith(".")]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # every trained episode made at least one request, in one segment
        assert m["agent/segments/calc"] >= 1 and m["agent/requests/calc"] >= 1
