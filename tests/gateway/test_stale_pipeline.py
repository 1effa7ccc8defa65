"""The full pipeline (in process, async, alpha 1) with agent episodes through the gateway:
an episode still running when the staleness bound passes it is aborted mid-episode, its
agent's ``openai`` client gets a clear 410, its trajectory is dropped as ``aborted:stale``
in drops.jsonl, and the run completes its steps with balanced accounting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("openai")

from gateway_parts import agent_config, run_config

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(600)

CONFIG = agent_config("agent_stale", "_stale_agent", max_turns=2000, max_new_tokens=4,
                      rollout={"batch_size": 4, "group_size": 2, "mode": "async", "alpha": 1},
                      train={"steps": 4})


def test_a_stale_agent_episode_is_aborted_through_the_gateway_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    import _stale_agent

    _stale_agent.reset()
    job, records, run_dir = run_config(CONFIG, tmp_path, 4)
    assert len(records) == 4  # the run went on
    # The slow agents' client raised the gateway's 410, naming the reason.
    assert _stale_agent.ERRORS, "no slow agent was refused"
    assert all(status == 410 and "aborted:stale" in message and "staleness bound" in message
               for status, message in _stale_agent.ERRORS), _stale_agent.ERRORS
    drops = [json.loads(x) for x in (run_dir / "drops.jsonl").read_text().splitlines()]
    stale = [d for d in drops if d["reason"] == "aborted:stale"]
    assert len(stale) == 2 and len({d["group"] for d in stale}) == 1, drops  # the slow group
    p = job.pipeline
    assert p.buffer.dropped["aborted:stale"] >= 2
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
