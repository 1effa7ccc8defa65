"""The full pipeline (in process, async, alpha 1) with agent episodes through the gateway:
an episode still running when the staleness bound passes it is aborted mid-episode, its
agent's ``openai`` client gets a clear 410, its trajectory is dropped as ``aborted:stale``
in drops.jsonl, and the run completes its steps with balanced accounting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("openai")

from rollart_sdk.config import load_config
from rollart_sdk.job import build_job, run_job

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(600)

CONFIG = {
    "name": "agent_stale", "seed": 0,
    "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                       "intermediate_size": 64, "seed": 0}},
    "tasks": [{"tag": "calc", "env": {"name": "agent", "options": {
        "run": "_stale_agent:run", "tasks": "_stale_agent:task"}},
        "reward": {"name": "rule", "options": {"mode": "env_return"}},
        "max_turns": 2000, "max_context_tokens": 512, "step_timeout_s": 300,
        "env_host": "thread", "sampling": {"max_new_tokens": 4}}],
    "engine": {"name": "torch", "options": {"max_running": 16}},
    "trainer": {"name": "torch", "options": {"lr": 0.001, "micro_batch_size": 8}},
    "transport": {"name": "local"},
    "rollout": {"batch_size": 4, "group_size": 2, "mode": "async", "alpha": 1},
    "train": {"steps": 4},
}


def test_a_stale_agent_episode_is_aborted_through_the_gateway_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    import _stale_agent

    _stale_agent.reset()
    path = tmp_path / "stale.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "output_dir": str(tmp_path / "runs")}))
    cfg, lines = load_config(path)
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        records = run_job(job, 4, progress=False)
    finally:
        job.close()
    assert len(records) == 4  # the run went on
    # The slow agents' client raised the gateway's 410, naming the reason.
    assert _stale_agent.ERRORS, "no slow agent was refused"
    assert all(status == 410 and "aborted:stale" in message and "staleness bound" in message
               for status, message in _stale_agent.ERRORS), _stale_agent.ERRORS
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir()
                  if d.is_dir() and not d.name.startswith(".")]
    drops = [json.loads(x) for x in (run_dir / "drops.jsonl").read_text().splitlines()]
    stale = [d for d in drops if d["reason"] == "aborted:stale"]
    assert len(stale) == 2 and len({d["group"] for d in stale}) == 1, drops  # the slow group
    p = job.pipeline
    assert p.buffer.dropped["aborted:stale"] >= 2
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
