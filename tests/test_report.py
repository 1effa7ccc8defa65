"""`rollart report`: streaming, the default timeline window, smoothing, both figures."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.cli.report_plots import default_window, load_timeline, make_report, smooth


def write_run(tmp_path, steps=40, per_step=200):
    metrics, events = [], []
    t = 1000.0
    for s in range(1, steps + 1):
        metrics.append({"step": s, "reward/A": s / steps, "success/A": s / steps,
                        "reward/B": 0.5, "success/B": 0.1, "staleness/max": 1,
                        "rollout/waste": 0.1, "rollout/waste_tokens": 0.05,
                        "rollout/launched_step": 32, "rollout/spanning_update": 3,
                        "length_bias/A": 1.0, "time/get_batch_wait": 0.1, "time/train": 0.5,
                        "time/weight_sync": 0.01})
        for i in range(per_step):
            events.append({"trajectory": f"x{s}-{i}", "span": "generate", "worker": "gen-0",
                           "t0": t + i * 0.004, "t1": t + i * 0.004 + 0.01})
        events.append({"trajectory": None, "span": "train", "worker": "train-0", "step": s,
                       "t0": t + 0.2, "t1": t + 0.9})
        t += 1.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    lines = "".join(json.dumps(e) + "\n" for e in events)
    (tmp_path / "events.jsonl").write_text(lines + '{"partial": ')  # killed mid-write
    return events


def test_default_window_is_three_training_steps_in_the_middle():
    spans = [(100.0 + k, 100.5 + k) for k in range(10)]
    lo, hi = default_window(spans, start=100.0)
    assert (lo, hi) == (4.0, 7.0)
    assert default_window([], start=0.0) == (0.0, 30.0)


def test_timeline_keeps_only_the_window_and_report_draws_both(tmp_path):
    events = write_run(tmp_path)
    kept, window, length = load_timeline(tmp_path / "events.jsonl", None, progress=False)
    assert window == pytest.approx((19.2, 22.2)) and length == pytest.approx(39.9)
    assert 0 < len(kept) < len(events) / 8
    assert all(e["t1"] >= window[0] and e["t0"] <= window[1] for e in kept)
    assert min(e["t0"] for e in kept) >= 0  # seconds since the run's first event
    paths = make_report(tmp_path)
    assert [p.name for p in paths] == ["rewards.png", "timeline.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    kept, window, _ = load_timeline(tmp_path / "events.jsonl", (0.0, 2.0), progress=False)
    assert window == (0.0, 2.0) and {e["trajectory"][:3] for e in kept if e["trajectory"]} <= {"x1-", "x2-", "x3-"}


def test_smoothing_is_a_trailing_mean_that_skips_gaps():
    nan = float("nan")
    assert smooth([1.0, 3.0, nan, 5.0], 2) == [1.0, 2.0, 3.0, 5.0]
    assert smooth([2.0], 5) == [2.0]


def test_report_without_metrics_says_what_to_give(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        make_report(tmp_path)


def test_policy_figure_when_the_trainer_reports_the_mismatch(tmp_path):
    write_run(tmp_path, steps=12, per_step=5)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for i, m in enumerate(lines):
        # a step without fresh tokens: no mismatch value (null in metrics.jsonl)
        m.update({"train/mismatch_mean": 1e-6 * (i + 1) if i != 3 else None,
                  "train/mismatch_max": 1e-5 * (i + 1) if i != 3 else None,
                  "train/mismatch_max/gen-0": 1e-5, "train/mismatch_max/gen-1": 2e-5,
                  "train/behaviour_ratio_mean": 1.0, "train/behaviour_ratio_max": 1.01,
                  "train/entropy": 1.3 - 0.1 * i})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    paths = make_report(tmp_path)
    assert [p.name for p in paths] == ["rewards.png", "policy.png", "timeline.png"]
    assert paths[1].stat().st_size > 10_000


def test_the_reward_of_every_finished_episode_is_drawn_where_it_is_not_the_batchs(
        tmp_path, monkeypatch):
    """rewards.png: reward_finished/<tag> (async: every episode that ended in the step)
    gets its own dotted line for a task where it differs from the batch's reward, none
    where they are the same (sync)."""
    import matplotlib.axes

    write_run(tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        m["reward_finished/A"] = min(1.0, m["reward/A"] + 0.1)  # the batch reads lower
        m["reward_finished/B"] = m["reward/B"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    labels: list[str] = []
    plot = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        labels.append(str(kwargs.get("label")))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    make_report(tmp_path)
    assert "A reward, every finished episode" in labels
    assert "B reward, every finished episode" not in labels
