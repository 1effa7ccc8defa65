"""kill -9 the quickstart five times and resume each time; print what happened (JSON).

    python scripts/chaos_quickstart.py [OUT_DIR] [--every N] [--seed S]

Runs ``rollart train examples/quickstart.yaml`` (Ray, 160 steps) with
``train.checkpoint_every=N`` (default 10), SIGKILLs the ``rollart train`` process five
times (twice while a checkpoint is being written, three times at a random moment 3-15 s
after the segment's first new metrics line), resumes with ``--resume`` each time, and
lets the last segment finish. After every kill: every complete checkpoint must pass its
manifest, and the steps lost (trained steps with a metrics line past the newest
checkpoint) must be at most one interval. At the end: metrics lines 1..160, accounting
balanced over all segments. The figures in docs/failures.md come from this script.
Bounded: a segment that runs past 600 s is killed and the script fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollart_sdk.control import checkpoints  # noqa: E402

STEPS = 160
POINTS = ["random", "save", "random", "save", "random"]


def lines(run: Path | None) -> int:
    f = run / "metrics.jsonl" if run else None
    return len(f.read_text().splitlines()) if f and f.is_file() else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="rollart-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    base = [sys.executable, "-m", "rollart_sdk.cli", "train", "examples/quickstart.yaml",
            "--no-progress", f"output_dir={out}", f"train.checkpoint_every={args.every}"]
    run: Path | None = None
    report: dict = {"every": args.every, "kills": []}
    t_start = time.monotonic()
    for i, point in enumerate([*POINTS, "finish"]):
        cmd = base + (["--resume", str(run)] if run else [])
        log = out / f"segment{i}.log"
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)
        before = lines(run)
        killed_at = None
        first_new = None
        delay = rng.uniform(3, 15)
        while proc.poll() is None:
            if time.monotonic() - t0 > 600:
                proc.kill()
                raise SystemExit(f"segment {i} ran past 600 s; see {log}")
            if run is None:
                found = [p for p in out.iterdir() if p.name.startswith("quickstart")]
                run = found[0] if found else None
            now_lines = lines(run)
            if point != "finish" and now_lines > before:
                first_new = first_new or time.monotonic()
                saving = run is not None and any(
                    p.name.endswith(".partial") for p in (run / "checkpoints").iterdir()) \
                    if run and (run / "checkpoints").is_dir() else False
                due = (point == "save" and saving) or (
                    point == "random" and time.monotonic() - first_new >= delay)
                if due:
                    killed_at = now_lines
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=60)
                    break
            time.sleep(0.005 if point == "save" else 0.05)
        seconds = round(time.monotonic() - t0, 1)
        if point == "finish":
            if proc.returncode != 0:
                raise SystemExit(f"the last segment failed (rc {proc.returncode}); see {log}")
            report["last_segment_s"] = seconds
            break
        if killed_at is None:
            raise SystemExit(f"segment {i} ended (rc {proc.returncode}) before its kill; see {log}")
        assert run is not None
        found = checkpoints.complete(run / "checkpoints")
        bad = {c.name: checkpoints.verify(c) for c in found if checkpoints.verify(c)}
        newest = found[0].step if found else 0
        report["kills"].append({"point": point, "segment_s": seconds, "lines_at_kill": killed_at,
                                "newest_checkpoint": newest, "steps_lost": killed_at - newest,
                                "unverifiable": bad})
        assert not bad, bad
        assert killed_at - newest <= args.every, report
    assert run is not None
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    rolled = run / "metrics.rolledback.jsonl"
    report.update(
        total_s=round(time.monotonic() - t_start, 1), steps=summary["steps"],
        resumes=summary["resumes"], metrics_steps_ok=[m["step"] for m in metrics] == list(
            range(1, STEPS + 1)),
        lines_rolled_back=len(rolled.read_text().splitlines()) if rolled.exists() else 0,
        launched=summary["launched"], trained=summary["trained"], dropped=summary["dropped"],
        balanced=summary["launched"] == summary["trained"] + sum(summary["dropped"].values()),
        checkpoints_left=sorted(p.name for p in (run / "checkpoints").iterdir()),
        learning=summary["learning"], run_dir=str(run))
    print(json.dumps(report, indent=1))
    ok = report["metrics_steps_ok"] and report["balanced"] and summary["steps"] == STEPS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
