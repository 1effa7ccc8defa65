"""`rollart eval` on an agent task (examples/agent_calc.yaml): the held-out episodes run
the agent through the gateway, as training does. Before, eval stepped the agent env with
the model's text as a plain env, and every episode was dropped (env_step_failed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("openai")

from rollart_sdk.testing.dists import run_cli

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def test_rollart_eval_runs_an_agent_task_through_the_gateway(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    # From the repository root, as the example says (the folder is importable: examples.)
    res = run_cli("eval", "examples/agent_calc.yaml", "--episodes", "4", "--out", str(out),
                  f"output_dir={tmp_path}", cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(out.read_text())["tasks"]["calc"]
    assert r["completed"] == 4 and not r["dropped"], r
    for e in r["per_episode"]:
        # the agent's model calls (requests; its loop asks again when the answer is not a
        # number, up to max_turns 3), each one of the model's turns
        assert 1 <= e["turns"] <= 3 and len(e["actions"]) == e["turns"], e
        assert e["reward"] in (0.0, 1.0)
