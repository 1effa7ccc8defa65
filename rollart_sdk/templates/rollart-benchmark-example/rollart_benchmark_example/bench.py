"""Benchmark ``example``: ``rollart bench example [ARGS]`` calls ``main(argv)``.

A benchmark owns its arguments (``rollart bench example --help`` prints them), runs the
same workload against an honest baseline with repeats, prints a table and returns the
exit status. This template times a sorted() of random floats against a list copy.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict


class ExampleOptions(BaseModel):
    """Benchmarks take their options on the command line: nothing to configure here."""

    model_config = ConfigDict(extra="forbid")


def ExampleBench(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rollart bench example",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--size", type=int, default=10000, help="items per run")
    p.add_argument("--repeats", type=int, default=5, help="runs; the median is reported")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args(argv)
    data = [random.Random(0).random() for _ in range(args.size)]
    figures: dict[str, float] = {}
    runs: list[tuple[str, Callable[[list[float]], object]]] = [
        ("copy (baseline)", list), ("sorted", sorted)]
    for label, fn in runs:
        times: list[float] = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn(data)
            times.append(time.perf_counter() - t0)
        figures[label] = statistics.median(times)
        print(f"{label:<16} median {figures[label] * 1e3:.3f} ms over {args.repeats} runs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f)
    return 0
