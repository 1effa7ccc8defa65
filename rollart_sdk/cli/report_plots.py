"""`rollart report RUN_DIR`: learning curves, rollout health and a worker timeline (PNG).

- ``rewards.png``: four panels per training step: reward (and success rate, where the env
  reports one and it differs from the reward) per task, smoothed over a window with the raw
  values faint behind, and the reward of every episode that ended in the step where it
  is not the batch's (async: ``reward_finished/<tag>``); rollout waste and length bias;
  trajectories launched and trained across a weight update per step; stage times;
- ``eval.png`` (a run with ``eval:``): the held-out evaluations per task, success (or
  reward) with its 95 % interval and mean turns, against the steps trained;
- ``policy.png``: the sampled policy against the trained one, per step: the
  train/inference mismatch ``|engine log-prob - trainer log-prob|`` on fresh tokens (mean
  and max, per engine worker when there are several; log scale), the behaviour ratio
  ``pi / mu`` and the policy's entropy - where a run that optimises something other than
  what the engines sample shows it first;
- ``timeline.png``: trajectories' spans per worker over wall time, like the paper's
  figures 8 and 9 (generation on engine workers, env reset/step on env workers, reward on
  reward workers, train and weight sync on the trainer / engines). By default a readable
  window: the three training steps in the middle of the run (``--window`` / ``--full``).

Both files are streamed: metrics.jsonl and events.jsonl are read line by line and only the
timeline window is kept, so that a long run's report takes seconds.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SPAN_COLOURS = {
    "generate": "#4C72B0",
    "env_reset": "#DD8452",
    "env_step": "#C44E52",
    "reward": "#55A868",
    "train": "#8172B3",
    "publish": "#937860",
    "weight_sync": "#DA8BC3",
}


def iter_jsonl(path: Path, progress: bool = False) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file, one at a time (a run killed mid-write leaves a partial
    last line: skipped). ``progress``: a line on stderr every 5 s for big files."""
    if not path.exists():
        return
    size = path.stat().st_size
    last = time.monotonic()
    with path.open("rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
            if progress and time.monotonic() - last > 5:
                last = time.monotonic()
                print(f"reading {path.name}: {f.tell() / size:.0%} of {size / 2**20:.1f} MB",
                      file=sys.stderr)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` steps (NaN-aware)."""
    out: list[float] = []
    for i in range(len(values)):
        xs = [v for v in values[max(0, i - window + 1) : i + 1] if v == v]
        out.append(sum(xs) / len(xs) if xs else float("nan"))
    return out


def _num(value: Any) -> float:
    """A metric as a float: missing and null (how metrics.jsonl writes nan) are nan."""
    return float("nan") if value is None else float(value)


def plot_rewards(metrics: list[dict[str, Any]], out: Path, window: int | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    w = window or max(1, len(metrics) // 20)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))

    def series(key: str) -> list[float]:  # null (a non-finite value in metrics.jsonl): nan
        return [_num(m.get(key)) for m in metrics]

    ax = axes[0][0]
    tags = sorted({k.split("/", 1)[1] for m in metrics for k in m if k.startswith("reward/")})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, tag in enumerate(tags):
        c = colours[i % len(colours)]
        rew, succ = series(f"reward/{tag}"), series(f"success/{tag}")
        same = all(a == b or (a != a and b != b) for a, b in zip(rew, succ, strict=True))
        label = f"{tag} reward" + (" (= success)" if same and any(s == s for s in succ) else "")
        ax.plot(steps, rew, color=c, alpha=0.2, linewidth=0.8)
        ax.plot(steps, smooth(rew, w), color=c, label=label)
        if not same and any(s == s for s in succ):
            ax.plot(steps, smooth(succ, w), color=c, linestyle="--", label=f"{tag} success")
        # Every episode that ended in the step, trained or not: drawn where it is not the
        # batch's (async: the batch holds the groups that completed first).
        fin = series(f"reward_finished/{tag}")
        if any(a == a and b == b and abs(a - b) > 1e-9 for a, b in zip(fin, rew, strict=True)):
            ax.plot(steps, smooth(fin, w), color=c, linestyle=":",
                    label=f"{tag} reward, every finished episode")
    # 0..1 unless a task's rewards leave it (penalties, e.g. GEM's -0.1 format error).
    values = [v for tag in tags for v in series(f"reward/{tag}") if v == v]
    ax.set_ylim(min([-0.05, *(v - 0.05 for v in values)]), max([1.05, *(v + 0.05 for v in values)]))
    ax.set_xlabel("training step")
    ax.set_title(f"reward per task (moving average over {w} steps; raw faint)")
    ax.legend(fontsize=8)

    ax = axes[0][1]
    if any("rollout/waste" in m for m in metrics):
        ax.plot(steps, series("rollout/waste"), label="waste: trajectories dropped / decided")
        ax.plot(steps, series("rollout/waste_tokens"), label="waste: generated tokens")
    for tag in tags:
        lb = series(f"length_bias/{tag}")
        if any(v == v for v in lb):
            ax.plot(steps, smooth(lb, w), linestyle=":", label=f"length bias {tag} (trained / finished turns)")
    ax.axhline(1.0, color="#999999", linewidth=0.5)
    ax.set_xlabel("training step")
    ax.set_title("rollout health (waste: lower is better; length bias: 1 = none)")
    ax.legend(fontsize=8)

    ax = axes[1][0]
    for key, label in (("rollout/launched_step", "trajectories launched"),
                       ("rollout/spanning_update", "trained, spanning a weight update"),
                       ("trajectories/aborted_stale", "aborted: outlived the bound")):
        if any(key in m for m in metrics):
            ax.plot(steps, smooth(series(key), w), label=label)
    smax = max((m.get("staleness/max") or 0 for m in metrics), default=0)
    ax.set_xlabel("training step")
    ax.set_title(f"per step (moving average); staleness max over the run: {smax}")
    ax.legend(fontsize=8)

    ax = axes[1][1]
    for k in ("time/get_batch_wait", "time/train", "time/weight_sync"):
        ax.plot(steps, smooth(series(k), w), label=k.split("/", 1)[1])
    ax.set_xlabel("training step")
    ax.set_ylabel("seconds")
    ax.set_title("stage times per step (moving average)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "rewards.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def default_window(train_spans: list[tuple[float, float]], start: float) -> tuple[float, float]:
    """Three training steps in the middle of the run (seconds since ``start``), or the first
    30 s when there is no training span."""
    if len(train_spans) < 2:
        return 0.0, 30.0
    spans = sorted(train_spans)
    mid = max(0, len(spans) // 2 - 1)
    lo = spans[mid][0]
    hi = spans[min(len(spans) - 1, mid + 3)][0]
    return lo - start, max(hi - start, lo - start + 1.0)


def load_timeline(path: Path, window: tuple[float, float] | None, progress: bool = True,
                  ) -> tuple[list[dict[str, Any]], tuple[float, float], float]:
    """Two streaming passes over events.jsonl: find the start and the training spans, then
    keep the events that overlap the window. Returns (events with times in seconds since
    the run's first event, window, run length)."""
    start, end = float("inf"), float("-inf")
    train: list[tuple[float, float]] = []
    for e in iter_jsonl(path, progress):
        t0, t1 = e.get("t0"), e.get("t1")
        if t0 is None or t1 is None:
            continue
        start, end = min(start, t0), max(end, t1)
        if e.get("span") == "train":
            train.append((t0, t1))
    if start == float("inf"):
        raise ValueError(f"no timeline events to draw ({path} is empty)")
    lo, hi = window if window is not None else default_window(train, start)
    kept = [dict(e, t0=e["t0"] - start, t1=e["t1"] - start) for e in iter_jsonl(path, False)
            if e.get("t0") is not None and e.get("t1") is not None
            and e["t1"] - start >= lo and e["t0"] - start <= hi]
    return kept, (lo, min(hi, end - start)), end - start


def plot_timeline(events: list[dict[str, Any]], out: Path, window: tuple[float, float] | None = None,
                  pools: dict[str, str] | None = None, run_length: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = [e for e in events if e.get("t0") is not None and e.get("t1") is not None]
    if not events:
        raise ValueError("no timeline events to draw (events.jsonl is empty)")
    start = min(e["t0"] for e in events) if window is None else 0.0
    workers = sorted({e["worker"] for e in events})
    row = {w: i for i, w in enumerate(workers)}
    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.45 * len(workers)))
    # One broken_barh call per (worker, span kind): fast for tens of thousands of spans.
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in events:
        groups.setdefault((e["worker"], e["span"]), []).append(
            (e["t0"] - start, max(e["t1"] - e["t0"], 1e-3)))
    for (worker, span), bars in groups.items():
        ax.broken_barh(bars, (row[worker] - 0.4, 0.8), facecolors=SPAN_COLOURS.get(span, "#999999"),
                       alpha=0.35 if span == "generate" else 0.8, linewidth=0)
    ax.set_yticks(range(len(workers)))
    pools = pools or {}
    ax.set_yticklabels([f"{w} @{pools[w]}" if w in pools else w for w in workers], fontsize=8)
    ax.set_xlabel("seconds since the run's first event")
    title = "timeline per worker (overlapping trajectories stack translucently)"
    if window is not None:
        ax.set_xlim(*window)
        title += f"; window {window[0]:.0f}-{window[1]:.0f} s"
        if run_length:
            title += f" of {run_length:.0f} s (--window A:B or --full for another)"
    ax.set_title(title)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in SPAN_COLOURS.items()],
              loc="upper right", fontsize=7, ncol=len(SPAN_COLOURS))
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_policy(metrics: list[dict[str, Any]], out: Path) -> Path | None:
    """``policy.png``, or None when the trainer reports no mismatch (an older run)."""
    if not any("train/mismatch_max" in m for m in metrics):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]

    def series(key: str) -> list[float]:  # null (a non-finite value in metrics.jsonl): nan
        return [_num(m.get(key)) for m in metrics]

    tasks = sorted({k.split("/", 1)[1] for m in metrics for k in m
                    if k.startswith("allowed_mass/")})
    fig, axes = plt.subplots(1, 4 if tasks else 3, figsize=(21 if tasks else 16, 4.5))
    ax = axes[0]
    ax.plot(steps, series("train/mismatch_mean"), label="mean over tokens")
    ax.plot(steps, series("train/mismatch_max"), label="max over tokens")
    workers = sorted({k.split("/", 2)[2] for m in metrics for k in m
                      if k.startswith("train/mismatch_max/")})
    for w in workers:
        ax.plot(steps, series(f"train/mismatch_max/{w}"), linestyle=":", label=f"max, {w}")
    if any(v > 0 for v in series("train/mismatch_max") if v == v):
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_title("|engine - trainer| log-prob, fresh tokens, same weights")
    ax.legend(fontsize=8)
    ax = axes[1]
    mean = series("train/behaviour_ratio_mean")
    # a step that ran no token (every advantage 0) reports max 0: no value, like the mean
    top = [mx if mn == mn else float("nan")
           for mn, mx in zip(mean, series("train/behaviour_ratio_max"), strict=True)]
    ax.plot(steps, mean, label="mean")
    ax.plot(steps, top, label="max")
    ax.axhline(1.0, color="#999999", linewidth=0.5)
    ax.set_xlabel("training step")
    ax.set_title("behaviour ratio pi / mu (1: on-policy)")
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.plot(steps, series("train/entropy"))
    ax.set_xlabel("training step")
    ax.set_title("entropy of the sampled policy (nats per token; gaps: no token\nrun, "
                 "every group's advantage 0)")
    if tasks:  # constrained tasks: the unmasked policy's mass on the allowed ids
        ax = axes[3]
        for tag in tasks:
            line, = ax.plot(steps, series(f"allowed_mass/{tag}"), label=tag)
            ax.plot(steps, series(f"allowed_mass_uniform/{tag}"), linestyle=":",
                    color=line.get_color(), label=f"{tag}, no preference")
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_title("probability mass on the allowed actions")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "policy.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_eval(evals: list[dict[str, Any]], out: Path) -> Path:
    """``eval.png``: the held-out evaluations (``eval:``): per task, success rate (or the
    mean reward where the env reports no success) with its 95 % interval, and mean turns,
    against the steps trained when each ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = sorted(evals, key=lambda m: m["step"])
    steps = [m["step"] for m in evals]
    tags = sorted({k.split("/")[1] for m in evals for k in m if k.startswith("eval/")
                   and k.count("/") == 2})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    for tag in tags:
        key = "success" if any(m.get(f"eval/{tag}/success") is not None for m in evals) else "reward"
        mid = [_num(m.get(f"eval/{tag}/{key}")) for m in evals]
        lo = [_num(m.get(f"eval/{tag}/{key}_lo")) for m in evals]
        hi = [_num(m.get(f"eval/{tag}/{key}_hi")) for m in evals]
        line = ax.plot(steps, mid, marker="o", label=f"{tag} {key}")[0]
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
        ax2.plot(steps, [_num(m.get(f"eval/{tag}/turns")) for m in evals], marker="o",
                 color=line.get_color(), label=f"{tag} turns")
    n = max((m.get(f"eval/{t}/episodes") or 0 for m in evals for t in tags), default=0)
    ax.set_title(f"held-out evaluation ({n} episodes per task; 95% interval shaded)")
    ax.set_xlabel("steps trained")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    ax2.set_title("mean turns per held-out episode")
    ax2.set_xlabel("steps trained")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path = out / "eval.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def make_report(run_dir: str | Path, window: tuple[float, float] | None = None,
                full: bool = False, smoothing: int | None = None) -> list[Path]:
    run = Path(run_dir)
    if not (run / "metrics.jsonl").exists():
        raise FileNotFoundError(
            f"{run} has no metrics.jsonl: give the directory `rollart train` printed"
        )
    lines = read_jsonl(run / "metrics.jsonl")
    metrics = [m for m in lines if m.get("kind") != "eval"]
    evals = [m for m in lines if m.get("kind") == "eval"]
    if not metrics:
        raise ValueError(f"{run / 'metrics.jsonl'} holds no step yet")
    paths = [plot_rewards(metrics, run, smoothing)]
    policy = plot_policy(metrics, run)
    if policy is not None:
        paths.append(policy)
    if evals:
        paths.append(plot_eval(evals, run))
    events_path = run / "events.jsonl"
    if events_path.exists() and events_path.stat().st_size:
        pools: dict[str, str] = {}
        if (run / "bindings.json").exists():
            pools = {b["worker"]: b["pool"] for b in json.loads((run / "bindings.json").read_text())}
        win = (0.0, float("inf")) if full else window
        try:
            events, win, length = load_timeline(events_path, win)
        except ValueError as exc:  # no spans yet: the curves alone are still worth drawing
            print(f"no timeline: {exc}", file=sys.stderr)
            return paths
        if events:
            paths.append(plot_timeline(events, run, win, pools, length))
    return paths
