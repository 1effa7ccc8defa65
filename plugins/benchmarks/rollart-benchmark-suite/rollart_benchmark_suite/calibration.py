"""``rollart bench calibration``: how well the simulator's cost model, fitted on this
machine, predicts a real CPU run (docs/simulation.md, "Calibration").

Each repeat is :func:`rollart_sdk.sim.calibrate.calibration_check` afresh: a real run in
process (torch engine and trainer, FrozenLake and arithmetic, the config of
``tests/sim/test_calibration.py``), then the engine and trainer costs fitted on fresh
instances, then the same run simulated with them and the workload measured from the real
run. Reported per repeat: the real and simulated median step time and the error
``sim / real - 1``; over repeats the median error against the target (within 20 %).

The fit and the real run are timed seconds apart: on a machine other processes share, a
load change between them moves the error, not the model. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

# The calibrated run (tests/sim/test_calibration.py runs the same) lives in the core beside
# calibration_check, so that the simulator's own test needs no benchmark package.
from rollart_sdk.sim.calibrate import REAL

TARGET = 0.20  # |median error| the model should reach on an idle machine


def run(repeats: int, steps: int) -> dict[str, Any]:
    from rollart_sdk.sim.calibrate import calibration_check

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    load_before = os.getloadavg()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="rollart-bench-calibration-") as tmp:
        for i in range(repeats):
            r = calibration_check(REAL, steps=steps, out_dir=str(Path(tmp) / f"r{i}"))
            rows.append({"repeat": i, "real_median_s": round(r["real_median_s"], 4),
                         "sim_median_s": round(r["sim_median_s"], 4),
                         "error": round(r["error"], 4),
                         "real_step_s": [round(x, 4) for x in r["real_step_s"]],
                         "sim_step_s": [round(x, 4) for x in r["sim_step_s"]],
                         "engine": r["engine"], "trainer": r["trainer"],
                         "train_overhead_s": r["train_overhead_s"], "swap_s": r["swap_s"],
                         "loadavg_1m_after": round(os.getloadavg()[0], 2)})
    median = statistics.median(r["error"] for r in rows)
    return {"benchmark": "calibration", "target": TARGET, "steps": steps, "rows": rows,
            "median_error": round(median, 4), "within_target": abs(median) < TARGET,
            "loadavg_before": list(load_before), "cores": os.cpu_count(),
            "wall_s": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollart bench calibration",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3, help="fit-and-run repeats (median)")
    parser.add_argument("--steps", type=int, default=7,
                        help="steps of each real and simulated run (the first is excluded)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 3:
        parser.error("--repeats must be >= 1 and --steps >= 3")
    res = run(args.repeats, args.steps)
    for r in res["rows"]:
        print(f"repeat {r['repeat']}: real median step {r['real_median_s']:.3f} s, simulated "
              f"{r['sim_median_s']:.3f} s, error {r['error']:+.1%} "
              f"(load {r['loadavg_1m_after']})")
    print(f"median error {res['median_error']:+.1%} (target within {TARGET:.0%}): "
          f"{'met' if res['within_target'] else 'NOT met'}; {res['wall_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    return 0
