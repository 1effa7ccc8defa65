"""Draw docs/guess_seeds.png: success per step of the guess-the-number runs, with baselines.

    python scripts/plot_guess.py docs/data/guess_seed*_2026-12-05.metrics.jsonl -o docs/guess_seeds.png
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rollart_env_arithmetic import baselines

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=Path("docs/guess_seeds.png"))
    ap.add_argument("--task", default="Guess")
    ap.add_argument("--window", type=int, default=15)
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path in args.metrics:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [r["step"] for r in rows]
        success = [r[f"success/{args.task}"] for r in rows]
        seed = re.search(r"seed(\d+)", path.name)
        label = f"seed {seed.group(1)}" if seed else path.stem
        ax.plot(steps, success, alpha=0.15)
        ax.plot(steps, _moving_average(success, args.window), label=label,
                color=ax.lines[-1].get_color())
    names = {"random": "random guesses", "ignore_feedback": "best ignoring the feedback",
             "binary_search": "binary search (best)"}
    for (key, value), style in zip(baselines(1, 8, 3).items(), (":", "--", "-."), strict=True):
        ax.axhline(value, color="black", linestyle=style, linewidth=1,
                   label=f"{names[key]}: {value:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("success (numbers 1..8, 3 guesses)")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
