"""The learning summary (summary.json, the end of `rollart train`) reads each step's
task_stats, so it still knows the first step after the pipeline freed its trajectories."""

from __future__ import annotations

from types import SimpleNamespace

from rollart_sdk.control.metrics import learning_summary
from rollart_sdk.control.pipeline import StepRecord, task_stats
from rollart_sdk.types import Trajectory


def _traj(tag: str, reward: float, success: bool | None) -> Trajectory:
    t = Trajectory(trajectory_id=f"{tag}-{reward}-{success}", tag=tag, group_id="g",
                   start_version=0)
    t.reward = reward
    if success is not None:
        t.info["success"] = success
    return t


def test_first_step_survives_freed_batches():
    records = []
    for step in range(20):
        batch = [_traj("A", float(step >= 10), step >= 10), _traj("A", 0.0, False),
                 _traj("B", 0.5, None)]
        rec = StepRecord(step=step, version=step, batch=batch, get_batch_wait_s=0.0,
                         task_stats=task_stats(batch))
        records.append(rec)
    for rec in records[:-4]:
        rec.batch = []  # what the pipeline does to old steps
    pipe = SimpleNamespace(records=records, carried={},
                           cfg=SimpleNamespace(tasks=[SimpleNamespace(tag="A"),
                                                      SimpleNamespace(tag="B")]))
    out = learning_summary(pipe)
    assert out["A"]["success_first_step"] == 0.0 and out["A"]["reward_first_step"] == 0.0
    assert out["A"]["success_last_tenth"] == 0.5 and out["A"]["reward_last_tenth"] == 0.5
    assert out["B"]["reward_first_step"] == 0.5 and out["B"]["success_first_step"] is None
