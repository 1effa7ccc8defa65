"""``rollart bench small --path train``: each variant run as ``rollart train CONFIG``, followed
through its metrics.jsonl and stopped by SIGTERM at the target. No speed thresholds: the
pytest timeout is the hang guard, the figures are docs/benchmarks.md's business."""

from __future__ import annotations

import json

import pytest
from rollart_benchmark_suite.small import TAG, summarize
from rollart_benchmark_suite.small_train import (
    MetricsTail,
    _as_data,
    follow,
    reached,
    run_train,
    train_config,
)

from rollart_sdk.cli import main
from rollart_sdk.config import load_config
from rollart_sdk.layout import choose_layout


def _line(step, success, wall):
    return {"step": step, "wall_time": wall, f"success/{TAG}": success, f"count/{TAG}": 64,
            f"turns/{TAG}": 5, "time/get_batch_wait": 1.0, "time/train": 0.5,
            "time/weight_sync": 0.01, "train/tokens": 900, "trajectories/aborted_stale": 0}


def _stream(batches):
    """A fake metrics stream: each read returns the next batch of lines (then nothing)."""
    it = iter(batches)
    return lambda: list(next(it, []))


def test_follow_stops_at_the_first_line_where_the_window_reaches_the_target():
    succ = [0.1, 0.5, 0.6, 0.8, 0.9, 0.6, 0.7, 0.9, 1.0]  # windows: 0.58, 0.68, 0.72 at 7
    lines = [_line(i + 1, s, 2.0 * (i + 1)) for i, s in enumerate(succ)]
    batches = [lines[:3], [], lines[3:5], lines[5:7], lines[7:]]
    got, why = follow(_stream(batches), alive=lambda: True, poll_s=0.0)
    assert why == "target" and [x["step"] for x in got] == list(range(1, 8))
    # an evaluation line (no success/<tag> of the task) is not a step of the window
    evals = [{"step": 5, "eval/FrozenLake/success": 1.0}] * 5
    got, why = follow(_stream([lines[:4] + evals]), alive=lambda: True, poll_s=0.0,
                      bound_s=0.0)
    assert why == "bound" and not reached([0.1, 0.5, 0.6, 0.8])


def test_follow_reads_the_last_lines_of_a_run_that_ended_by_itself():
    alive = iter([True, True, False])
    lines = [_line(i + 1, 0.0, float(i + 1)) for i in range(3)]
    got, why = follow(_stream([lines[:1], lines[1:]]), alive=lambda: next(alive),
                      poll_s=0.0)
    assert why == "ended" and len(got) == 3


def test_metrics_tail_keeps_a_line_being_written_for_the_next_read(tmp_path):
    tail = MetricsTail(tmp_path)
    assert tail.read() == []  # no run directory yet
    run = tmp_path / "small-sync-none-0-20261205"
    run.mkdir()
    path = run / "metrics.jsonl"
    first = json.dumps(_line(1, 0.2, 1.5))
    second = json.dumps(_line(2, 0.4, 3.0))
    path.write_text(first + "\n" + second[:10])
    got = tail.read()
    assert [x["step"] for x in got] == [1] and "seen" in got[0]
    with open(path, "a") as f:
        f.write(second[10:] + "\n")
    assert [x["step"] for x in tail.read()] == [2]
    assert tail.read() == []


def test_step_times_come_from_wall_time_after_the_earliest_start():
    # start-up ended at 110 (seen - wall_time); the second line was read 0.3 s late
    lines = [{**_line(1, 1.0, 2.0), "seen": 112.0}, {**_line(2, 1.0, 4.0), "seen": 114.3}]
    lines += [{**_line(i, 1.0, 2.0 * i), "seen": 110.0 + 2.0 * i} for i in (3, 4, 5)]
    data = _as_data(lines + [{"step": 5, "eval/x": 1.0, "seen": 121.0}], t_cmd=100.0)
    assert data["t_ready"] == pytest.approx(110.0)
    assert [m["t"] for m in data["metrics"]] == pytest.approx([112, 114, 116, 118, 120])
    row = summarize("sync", "none", 0, 100.0, data, target=0.7)
    assert row["steps_to_target"] == 5 and row["time_to_target_s"] == pytest.approx(20.0)
    assert row["startup_s"] == pytest.approx(10.0) and row["cpu_s_to_target"] is None


def test_the_config_file_leaves_the_layout_to_the_cli_unless_asked(tmp_path):
    cfg = train_config("sync", "normal", 1, str(tmp_path), 60, None, "/models/tiny")
    assert "layout" not in cfg and cfg["model"] == {"path": "/models/tiny"}
    assert cfg["tasks"][0]["env"]["name"] == "bench-frozenlake"
    assert cfg["tasks"][0]["env"]["options"]["mu"] == 0.05
    parsed, _ = load_config(data=train_config("sync", "none", 0, str(tmp_path), 60, None, None))
    assert choose_layout(parsed).asked == "auto"
    cfg = train_config("async", "none", 0, str(tmp_path), 60, "ray", None)
    assert cfg["layout"] == "ray" and cfg["rollout"]["mode"] == "async"


def test_path_train_refuses_the_single_process_references(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "small", "--path", "train", "--modes", "reference"])
    assert "--modes sync and/or async only" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_a_real_rollart_train_run_is_stopped_by_sigterm_at_the_target():
    # Target 0: the window of 5 steps holds at step 5, long before the 30 asked for, so
    # the bench stops the run; the exit (checkpoint and summary) is bounded by stop().
    row = run_train("sync", "none", 0, max_steps=30, target=0.0, exit_bound_s=90.0)
    assert row["path"] == "train" and row["followed"] == "target"
    assert row["steps_to_target"] == 5 and row["reached"]
    assert row["ended_by"] in ("sigterm", "itself") and row["exit_code"] in (143, 0)
    if row["ended_by"] == "sigterm":
        assert row["exit_code"] == 143 and row["exit_s"] is not None
    assert row["layout"] in ("inprocess", "ray") and row["layout_why"]
    # the thread plan, applied per worker in either layout (sync: the trainer has every core)
    assert row["torch_threads"]["actor_train"] >= row["torch_threads"]["actor_gen"] >= 1
    assert row["time_to_target_s"] > row["startup_s"] > 0
    assert len(row["success_per_step"]) == row["steps"] >= 5


def test_the_command_forwards_path_layout_target_and_overrides(monkeypatch, tmp_path):
    # The runs themselves are the test above's; here only what the command hands them.
    import rollart_benchmark_suite.small as small
    import rollart_benchmark_suite.small_train as small_train

    calls = []

    def fake_run_train(mode, latency, seed, max_steps, layout, overrides, model_path,
                       target):
        calls.append((mode, latency, seed, max_steps, layout, overrides, model_path, target))
        lines = [{**_line(i, 1.0, float(i)), "seen": 10.0 + i} for i in range(1, 6)]
        row = summarize(mode, latency, seed, 5.0, _as_data(lines, 5.0), target=target)
        return {**row, "path": "train", "layout": "inprocess", "ended_by": "sigterm",
                "exit_code": 143, "exit_s": 0.5}

    monkeypatch.setattr(small_train, "run_train", fake_run_train)
    monkeypatch.setattr(small, "build_model", lambda cache_dir: "/built/model")
    out = tmp_path / "rows.json"
    assert main(["bench", "small", "--path", "train", "--modes", "sync", "--latency", "none",
                 "--seeds", "4", "--max-steps", "7", "--target", "0.2",
                 "--set", "trainer.options.lr=0.002", "--json", str(out)]) == 0
    assert calls == [("sync", "none", 4, 7, None, ["trainer.options.lr=0.002"],
                      "/built/model", 0.2)]
    data = json.loads(out.read_text())
    assert data["path"] == "train" and data["layout"] == "auto" and data["target"] == 0.2
    assert data["rows"][0]["steps_to_target"] == 5 and data["rows"][0]["exit_code"] == 143
