"""`rollart report RUN_DIR`: reward curves and a per-worker timeline, as PNG files.

- ``rewards.png``: reward (and success rate, where the env reports it) per task per step,
  plus staleness and stage times;
- ``timeline.png``: trajectories' spans per worker over wall time, like the paper's
  figures 8 and 9: generation on engine workers, env reset/step on env workers, reward
  on reward workers, train and weight sync on the trainer / engines.
"""

from __future__ import annotations

import argparse
import json
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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a run killed mid-write leaves a partial last line
    return out


def plot_rewards(metrics: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] + 1 for m in metrics]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    keys = sorted({k for m in metrics for k in m if k.startswith(("reward/", "success/"))})
    for k in keys:
        ax.plot(steps, [m.get(k, float("nan")) for m in metrics], label=k,
                linestyle="--" if k.startswith("success/") else "-")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean over the batch")
    ax.set_title("reward per task")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(steps, [m["staleness/max"] for m in metrics], label="staleness max")
    ax.plot(steps, [m["staleness/mean"] for m in metrics], label="staleness mean")
    ax.set_xlabel("training step")
    ax.set_title("staleness (trainer version - start version)")
    ax.legend(fontsize=8)
    ax = axes[2]
    for k in ("time/get_batch_wait", "time/train", "time/weight_sync"):
        ax.plot(steps, [m.get(k, 0.0) for m in metrics], label=k.split("/", 1)[1])
    ax.set_xlabel("training step")
    ax.set_ylabel("seconds")
    ax.set_title("stage times per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "rewards.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(events: list[dict[str, Any]], out: Path, max_seconds: float | None = None,
                  pools: dict[str, str] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = [e for e in events if e.get("t0") is not None and e.get("t1") is not None]
    if not events:
        raise ValueError("no timeline events to draw (events.jsonl is empty)")
    start = min(e["t0"] for e in events)
    if max_seconds is not None:
        events = [e for e in events if e["t0"] - start <= max_seconds]
    workers = sorted({e["worker"] for e in events})
    row = {w: i for i, w in enumerate(workers)}
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.45 * len(workers)))
    for e in events:
        colour = SPAN_COLOURS.get(e["span"], "#999999")
        ax.barh(row[e["worker"]], max(e["t1"] - e["t0"], 1e-3), left=e["t0"] - start,
                height=0.8, color=colour, alpha=0.35 if e["span"] == "generate" else 0.8,
                linewidth=0)
    ax.set_yticks(range(len(workers)))
    pools = pools or {}
    ax.set_yticklabels([f"{w} @{pools[w]}" if w in pools else w for w in workers], fontsize=8)
    ax.set_xlabel("seconds since the first event")
    ax.set_title("timeline per worker (overlapping trajectories stack translucently)")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in SPAN_COLOURS.items()],
              loc="upper right", fontsize=7, ncol=len(SPAN_COLOURS))
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_report(run_dir: str | Path, max_seconds: float | None = None) -> list[Path]:
    run = Path(run_dir)
    if not (run / "metrics.jsonl").exists():
        raise FileNotFoundError(
            f"{run} has no metrics.jsonl: give the directory `rollart train` printed"
        )
    metrics = read_jsonl(run / "metrics.jsonl")
    if not metrics:
        raise ValueError(f"{run / 'metrics.jsonl'} holds no step yet")
    paths = [plot_rewards(metrics, run)]
    events = read_jsonl(run / "events.jsonl")
    if events:
        pools: dict[str, str] = {}
        if (run / "bindings.json").exists():
            pools = {b["worker"]: b["pool"] for b in json.loads((run / "bindings.json").read_text())}
        paths.append(plot_timeline(events, run, max_seconds, pools))
    return paths


def cmd_report(args: argparse.Namespace) -> int:
    for p in make_report(args.run_dir, args.max_seconds):
        print(p)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="draw reward curves and a worker timeline (PNG)")
    p.add_argument("run_dir")
    p.add_argument("--max-seconds", type=float, help="timeline: only the first N seconds")
    p.set_defaults(func=cmd_report)
