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


def test_eval_takes_an_agents_own_temperature_that_training_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training refuses a request whose temperature is not the task's (the trainer learns
    the task's policy); an evaluation trains nothing, so it takes the request and samples
    with the eval's settings (greedy by default), instead of dropping every episode."""
    import yaml
    from gateway_parts import agent_config

    from rollart_sdk.cli import main
    from rollart_sdk.gateway.episode import GatewayError
    from rollart_sdk.gateway.params import request_params
    from rollart_sdk.types import SamplingParams

    task = SamplingParams(temperature=1.0, max_new_tokens=8)
    with pytest.raises(GatewayError, match="temperature=0.7 differs from the task's"):
        request_params({"temperature": 0.7}, task, 0, 0)
    params = request_params({"temperature": 0.7}, task, 0, 0, strict=False)
    assert params.sampling.temperature == 1.0  # the task's (here: the eval's) policy

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    config = agent_config("hot", "_hot_agent", max_turns=2, max_new_tokens=4,
                          rollout={"batch_size": 2, "group_size": 2}, train={"steps": 1})
    path = tmp_path / "hot.yaml"
    path.write_text(yaml.safe_dump({**config, "output_dir": str(tmp_path / "runs")}))
    out = tmp_path / "eval.json"
    assert main(["eval", str(path), "--episodes", "4", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["tasks"]["calc"]
    assert r["completed"] == 4 and not r["dropped"], r
