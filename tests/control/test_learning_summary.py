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


def _pipe(records, tags=("A",)):
    return SimpleNamespace(records=records, carried={},
                           cfg=SimpleNamespace(tasks=[SimpleNamespace(tag=t) for t in tags]))


def _step(step, successes, tag="A"):
    batch = [_traj(tag, float(s), bool(s)) for s in successes]
    for i, t in enumerate(batch):
        t.trajectory_id += f"-{i}"
    return StepRecord(step=step, version=step, batch=batch, get_batch_wait_s=0.0,
                      task_stats=task_stats(batch))


def test_first_and_last_tenth_with_their_spread():
    from rollart_sdk.control.metrics import learning_lines

    # Issue #38's run: the first step happens to be low (0.25), but the first tenth
    # averages the same as the last: no clear change, whatever the first step says.
    flat = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 1], [1, 0, 1, 0]]
    records = [_step(i, flat[i % 4] if i else [1, 0, 0, 0]) for i in range(40)]
    out = learning_summary(_pipe(records))["A"]
    assert out["success_first_step"] == 0.25
    assert out["success_first_tenth"] == out["success_last_tenth"] == 0.375
    assert out["success_first_tenth_sd"] > 0.1
    assert out["success_change"] == "no clear change"
    (line,) = learning_lines({"A": out})
    assert line.startswith("A: success 0.38 +- 0.") and "(no clear change; first step 0.25)" in line
    # A task that learns: 0-1 of 4 at first, 3-4 of 4 at the end.
    rising = [_step(i, [1, 0, 0, 0] if i % 2 else [0, 0, 0, 0]) for i in range(20)]
    rising += [_step(20 + i, [1, 1, 1, 0] if i % 2 else [1, 1, 1, 1]) for i in range(20)]
    out = learning_summary(_pipe(rising))["A"]
    assert out["success_change"] == "up" and out["reward_change"] == "up"
    assert "over the last tenth (up;" in learning_lines({"A": out})[0]
    # Fewer than 20 steps: one step per tenth; a success rate still has a binomial spread,
    # a bare reward cannot be told.
    short = learning_summary(_pipe([_step(i, [0, 0, 0, 0]) for i in range(3)]
                                   + [_step(3, [1, 1, 1, 1])]))["A"]
    assert short["success_change"] == "up" and short["success_first_tenth_sd"] is None
    recs = []
    for i in range(3):
        batch = [_traj("B", 0.5, None)]
        recs.append(StepRecord(step=i, version=i, batch=batch, get_batch_wait_s=0.0,
                               task_stats=task_stats(batch)))
    b = learning_summary(_pipe(recs, ("B",)))["B"]
    assert b["success_last_tenth"] is None and b["reward_change"] is None
    assert learning_lines({"B": b}) == [
        "B: reward 0.50 over the first tenth -> 0.50 over the last tenth (too few steps to "
        "tell; first step 0.50)"]


def _async_step(step, batch_successes, finished, before):
    """A step whose batch holds ``batch_successes`` and in which the episodes
    ``finished`` (1 won, 0 lost) ended; ``before``: the counts up to the step before."""
    rec = _step(step, batch_successes)
    n, wins = before[0] + len(finished), before[1] + sum(finished)
    rec.finished_outcomes = {"A": (n, float(wins), n, wins)}
    return rec, (n, wins)


def test_the_summary_says_what_every_finished_episode_did_not_only_the_batch():
    """Async: the batch is the groups that completed first (here the losing short
    episodes); the learning summary reads every finished episode of the step, trained or
    not, and says so."""
    from rollart_sdk.control.metrics import learning_lines

    records, counts = [], (0, 0)
    for i in range(20):
        # the batch: 1 of 4 won at every step; the finished episodes: 1 of 4 at first, 3 of
        # 4 from step 10 (the long winning episodes finish after the batch formed)
        finished = [1, 0, 0, 0] if i < 10 else [1, 1, 1, 0]
        rec, counts = _async_step(i, [1, 0, 0, 0], finished, counts)
        records.append(rec)
    out = learning_summary(_pipe(records))["A"]
    assert out["over"] == "finished episodes"
    assert out["success_first_step"] == 0.25 and out["success_last_tenth"] == 0.75
    assert out["success_change"] == "up"
    (line,) = learning_lines({"A": out})
    assert line.startswith("A: success of finished episodes 0.25 +- 0.00 over the first tenth -> "
                           "0.75 +- 0.00 over the last tenth (up;")
    # The same run counted by batch would see no change: what the old summary said.
    for r in records:
        r.finished_outcomes = {}
    old = learning_summary(_pipe(records))["A"]
    assert old["over"] == "batches" and old["success_last_tenth"] == 0.25
    assert old["success_change"] == "no clear change"


def test_finished_figures_count_from_the_resumed_totals_and_an_old_checkpoint_falls_back():
    from rollart_sdk.control.metrics import summary_carry

    records, counts = [], (0, 0)
    for i in range(4):
        rec, counts = _async_step(i, [0, 0], [1, 1, 0, 0], counts)
        records.append(rec)
    # A resumed session: its first step's episodes count from the checkpoint's totals.
    carried = summary_carry(_pipe(records[:2]))
    assert [f["A"]["n"] for f in carried["finished_stats"]] == [4.0, 4.0]
    pipe = _pipe(records[2:])
    pipe.carried, pipe.session_start = carried, records[1]
    out = learning_summary(pipe)["A"]
    assert out["over"] == "finished episodes" and out["success_last_tenth"] == 0.5
    assert [f["A"]["n"] for f in summary_carry(pipe)["finished_stats"]] == [4.0] * 4
    # A checkpoint written before the finished figures: the batches, for the whole run.
    pipe.carried = {"task_stats": carried["task_stats"]}
    assert learning_summary(pipe)["A"]["over"] == "batches"


def test_a_task_with_no_episode_ended_in_the_last_tenth_is_told_over_its_batches():
    """A short async run: the last step's batch holds the task's groups, but none of its
    episodes ended in that step. The summary then reads the batches, not "n/a"."""
    records, counts = [], (0, 0)
    for i in range(4):
        rec, counts = _async_step(i, [1, 1, 0, 0], [1, 0, 0, 0] if i < 3 else [], counts)
        records.append(rec)
    out = learning_summary(_pipe(records))["A"]
    assert out["over"] == "batches" and out["success_last_tenth"] == 0.5
