"""Every segment of an agent episode is trained (docs/gateway.md section 4): the full
pipeline (in process) with an agent that rewrites its history once per episode. The
trainer gets one sample per segment, each holding exactly the engine's tokens of that
segment, and the earlier segment takes its trajectory's advantage; the group statistics
count each trajectory once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("openai")
trainer_mod = pytest.importorskip("rollart_trainer_torch.trainer")

from gateway_parts import agent_config, run_config  # noqa: E402

from rollart_sdk.algorithms import grpo_advantages  # noqa: E402

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(600)

CONFIG = agent_config("agent_segments", "_summarizing_agent", max_turns=4, max_new_tokens=5,
                      rollout={"batch_size": 4, "group_size": 2, "mode": "sync"},
                      train={"steps": 2, "samples_per_task": 8})


def test_both_segments_of_a_summarising_agent_are_trained(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    batches: list[list[Any]] = []
    real = trainer_mod.TorchTrainer.train_step

    def spy(self: Any, batch: list[Any]) -> dict[str, float]:
        out = real(self, batch)  # advantages are filled in place
        batches.append(list(batch))
        return out

    monkeypatch.setattr(trainer_mod.TorchTrainer, "train_step", spy)
    _, records, run_dir = run_config(CONFIG, tmp_path, 2)
    assert len(records) == 2 and len(batches) == 2
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    trained = {r["trajectory"]: r for r in rows if r["outcome"] == "trained"}
    for batch in batches:
        by_traj: dict[str, dict[int, Any]] = {}
        for s in batch:
            by_traj.setdefault(s.trajectory_id, {})[s.segment] = s
        assert len(by_traj) == 4  # batch_size trajectories ...
        assert all(set(parts) == {0, 1} for parts in by_traj.values())  # ... of 2 segments
        for tid, parts in by_traj.items():
            first, last = parts[1], parts[0]
            # Same reward and advantage for both segments of a trajectory.
            assert first.reward == last.reward and first.advantage == last.advantage
            if tid in trained:  # what the engine generated, segment by segment
                row = trained[tid]
                (earlier,) = row["earlier_segments"]
                for sample, turns in ((first, earlier), (last, row["turns"])):
                    gen = [i for t in turns for i in t["action_ids"]]
                    got = [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
                    assert got == gen and len(gen) > 0
        # The group statistics count each trajectory once: the advantages are GRPO's over
        # one sample per trajectory.
        members = [parts[0] for parts in by_traj.values()]
        want = grpo_advantages(torch.tensor([s.reward for s in members], dtype=torch.float64),
                               [s.group_id for s in members])
        assert [s.advantage for s in members] == pytest.approx(want.tolist())
    assert trained, "samples.jsonl holds no trained trajectory"
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["agent/segments/calc"] == 2 and m["turns/calc"] == 2 for m in metrics)
    # `rollart samples` shows both segments of an episode.
    from rollart_sdk.cli import main

    capsys.readouterr()
    assert main(["samples", str(run_dir), "--trained", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "=== segment 1 of 2 (trained as its own sample) ===" in out
    assert "=== segment 2 of 2 (the last) ===" in out and "Summary so far" in out
