"""Draw the mixed-precision comparison of docs/trainers.md: success per step of SmolLM2
runs in float32 and in bfloat16 (with and without fp32 master weights), same seeds, and the
table of their figures.

    python scripts/plot_precision.py fp32:RUN_S0 fp32:RUN_S1 bf16:RUN_S0 ... \\
        -o docs/smollm2_arithmetic_bf16_vs_fp32.png

Each argument is ``LABEL:PATH``, PATH a run directory (its ``metrics.jsonl``) or a
metrics file; runs with the same label share a colour.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rollart_sdk.cli.report_plots import read_jsonl, smooth


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = read_jsonl(path / "metrics.jsonl" if path.is_dir() else path)
    return [r for r in rows if "step" in r and any(k.startswith("success/") for k in r)]


def figures(rows: list[dict[str, Any]], task: str) -> dict[str, Any]:
    """First and last tenth, the mean, the first step whose 5-step mean reaches 0.9, the
    mismatch and the seconds per step of one run."""
    success = [r[f"success/{task}"] for r in rows]
    tenth = max(1, len(success) // 10)
    avg5 = smooth(success, 5)
    reach = next((rows[i]["step"] for i, v in enumerate(avg5) if i >= 4 and v >= 0.9), None)
    mism = [r["train/mismatch_max"] for r in rows if r.get("train/mismatch_tokens")]
    steps_s = [b["wall_time"] - a["wall_time"] for a, b in zip(rows, rows[1:], strict=False)]
    steps_s.sort()
    return {"steps": len(success), "first_tenth": sum(success[:tenth]) / tenth,
            "last_tenth": sum(success[-tenth:]) / tenth, "mean": sum(success) / len(success),
            "reach_0.9": reach, "mismatch_max": max(mism) if mism else None,
            "step_s_median": steps_s[len(steps_s) // 2] if steps_s else None}


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL:PATH")
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--task", default="Arithmetic")
    ap.add_argument("--window", type=int, default=5)
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours: dict[str, str] = {}
    styles = ["-", "--", ":", "-."]
    print("| run | steps | success first tenth -> last tenth | mean | 5-step mean >= 0.9 at "
          "| mismatch max | s a step (median) |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.runs:
        label, _, path = spec.partition(":")
        rows = _rows(Path(path))
        f = figures(rows, args.task)
        steps = [r["step"] for r in rows]
        success = [r[f"success/{args.task}"] for r in rows]
        seen = list(colours)
        colour = colours.setdefault(label, f"C{len(seen)}")
        n = sum(1 for s in args.runs if s.partition(":")[0] == label
                and args.runs.index(s) < args.runs.index(spec))
        ax.plot(steps, smooth(success, args.window), color=colour,
                linestyle=styles[n % len(styles)], label=label if n == 0 else None)
        mm = f"{f['mismatch_max']:.1e}" if f["mismatch_max"] is not None else "-"
        print(f"| {label} {Path(path).name} | {f['steps']} | {f['first_tenth']:.2f} -> "
              f"{f['last_tenth']:.2f} | {f['mean']:.2f} | {f['reach_0.9']} | {mm} | "
              f"{f['step_s_median']:.1f} |")
    ax.set_xlabel("step")
    ax.set_ylabel(f"success ({args.window}-step mean)")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
