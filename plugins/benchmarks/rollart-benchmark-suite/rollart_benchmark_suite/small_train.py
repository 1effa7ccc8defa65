"""``rollart bench small --path train``: the workload run exactly as a user runs it.

``--path job`` (the default) drives ``build_job(...)`` from a child process of the bench.
``--path train`` writes each variant's config as a YAML file and starts ``python -m
rollart_sdk.cli train CONFIG`` (the ``rollart`` command) as a subprocess: its run
directory, console output, signal handling and ``layout: auto`` (unless ``--layout`` is
given: then the config's ``layout:`` key) are the CLI's own. The bench follows the run's
``metrics.jsonl`` while it runs; when the success rate over the last ``WINDOW`` steps
reaches the target it sends SIGTERM, as a user stopping the run would (``rollart train``
then saves its checkpoint and summary and exits with 143), and records how long the exit
took. A run that does not exit within ``EXIT_BOUND_S`` of the signal is killed (its whole
process group) and reported ``ended_by: killed``, not waited on.

Timing: a metrics line's ``wall_time`` counts from the pipeline's start, so a step's time
is ``t_ready + wall_time``, where ``t_ready`` (the end of start-up) is the earliest
``seen - wall_time`` over the lines (``seen``: when the bench read the line, polled every
``POLL_S``). ``time_to_target_s`` counts from the command's start (``Popen``), as a user's
stopwatch would. CPU seconds are not known on this path (another process, and Ray's).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rollart_benchmark_suite.small import (
    TAG,
    TARGET,
    WINDOW,
    step_success,
    summarize,
    workload_config,
)

POLL_S = 0.05  # how often metrics.jsonl is read
EXIT_BOUND_S = 60.0  # SIGTERM to exit, at most; then the process group is killed
RUN_BOUND_S = 1800.0  # a run that neither reaches the target nor ends by then is stopped


def train_config(mode: str, latency: str, seed: int, output_dir: str, max_steps: int,
                 layout: str | None, model_path: str | None) -> dict[str, Any]:
    """The variant's config file for ``rollart train``: the workload's config with the
    ``ray`` transport (``inprocess`` replaces it with ``local``, as it does for any user's
    config), ``layout:`` only when one is asked for (else the CLI's default, auto), and the
    model built once by the bench (the same checkpoint as the ``job`` path's runs load)."""
    cfg = workload_config(mode, latency, seed, output_dir, max_steps, layout="ray")
    if model_path:
        cfg["model"] = {"path": model_path}
    if layout is not None:
        cfg["layout"] = layout
    return cfg


class MetricsTail:
    """The complete lines added to ``ROOT/*/metrics.jsonl`` (the run directory the CLI
    creates under ``output_dir``) since the last :meth:`read`, each with ``seen``: the
    time this read found it. A line still being written is kept for the next read."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path: Path | None = None
        self._pos = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        if self.path is None:
            found = sorted(self.root.glob("*/metrics.jsonl"))
            if not found:
                return []
            self.path = found[0]
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            chunk = f.read()
        self._pos += len(chunk)
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        now = time.time()
        return [{**json.loads(line), "seen": now} for line in complete if line.strip()]


def step_successes(lines: list[dict[str, Any]]) -> list[float]:
    """The per-step success rates (training steps only: evaluation lines have no
    ``success/<tag>`` of the workload's task)."""
    return [step_success(x) for x in lines if f"success/{TAG}" in x]


def reached(successes: list[float], target: float = TARGET, window: int = WINDOW) -> bool:
    """The bench's rule: the mean success of the last ``window`` steps is >= ``target``."""
    return len(successes) >= window and sum(successes[-window:]) / window >= target


def follow(read: Callable[[], list[dict[str, Any]]], alive: Callable[[], bool],
           target: float = TARGET, bound_s: float = RUN_BOUND_S,
           poll_s: float = POLL_S) -> tuple[list[dict[str, Any]], str]:
    """Read metrics lines while the run is ``alive``: returns them and why following
    stopped, ``target`` (the rule holds at the last line read), ``ended`` (the process
    exited; its last lines read) or ``bound`` (``bound_s`` passed)."""
    lines: list[dict[str, Any]] = []
    deadline = time.time() + bound_s
    while True:
        running = alive()
        lines += read()
        if reached(step_successes(lines), target):
            return lines, "target"
        if not running:
            return lines, "ended"
        if time.time() > deadline:
            return lines, "bound"
        time.sleep(poll_s)


def stop(proc: subprocess.Popen[bytes], bound_s: float = EXIT_BOUND_S
         ) -> tuple[int, float, str]:
    """SIGTERM to the run (if it still runs), then wait at most ``bound_s``: the exit
    code, the seconds from the signal to the exit, and ``sigterm`` or ``killed`` (it hung:
    its process group got SIGKILL), or ``itself`` when it had already ended."""
    t0 = time.time()
    if proc.poll() is not None:
        return proc.returncode, 0.0, "itself"
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=bound_s)
        return rc, time.time() - t0, "sigterm"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session (start_new_session=True)
        rc = proc.wait()
        return rc, time.time() - t0, "killed"


def _run_dir_layout(root: Path) -> dict[str, Any] | None:
    """The layout the run used and why (``summary.json``, else ``plan.json``)."""
    for name in ("summary.json", "plan.json"):
        for path in sorted(root.glob(f"*/{name}")):
            layout = json.loads(path.read_text()).get("layout")
            if layout:
                return dict(layout)
    return None


def _run_dir_threads(root: Path) -> dict[str, Any] | None:
    """The torch threads the run gave its engine and trainer (``plan.json``: the thread
    plan, per worker in either layout; ``None`` for a role that kept the process's)."""
    for path in sorted(root.glob("*/plan.json")):
        threads = json.loads(path.read_text()).get("threads") or {}
        return {k: threads.get(k) for k in ("actor_gen", "actor_train")}
    return None


def _as_data(lines: list[dict[str, Any]], t_cmd: float) -> dict[str, Any]:
    """What :func:`~rollart_benchmark_suite.small.summarize` reads, from metrics.jsonl lines."""
    steps = [x for x in lines if f"success/{TAG}" in x]
    t_ready = min((x["seen"] - x["wall_time"] for x in steps), default=t_cmd)
    metrics = [{**x, "t": t_ready + x["wall_time"], "train_tokens": x.get("train/tokens", 0.0)}
               for x in steps]
    return {"t_start": None, "t_ready": t_ready, "cpu_ready": None, "metrics": metrics}


def run_train(mode: str, latency: str, seed: int, max_steps: int, layout: str | None = None,
              overrides: list[str] | None = None, model_path: str | None = None,
              target: float = TARGET, exit_bound_s: float = EXIT_BOUND_S) -> dict[str, Any]:
    """One variant through ``rollart train``: the row ``--path job`` gives (figures that
    need the run's own process, CPU seconds and the engine's stats, are None or absent)
    plus ``path``, ``layout`` (used), ``layout_why``, ``torch_threads`` (engine's and
    trainer's, from the run's plan), ``ended_by``, ``exit_code`` and ``exit_s`` (SIGTERM
    to exit; None when the run ended by itself)."""
    with tempfile.TemporaryDirectory(prefix="rollart-bench-small-train-") as tmp:
        root = Path(tmp) / "runs"
        cfg_path = Path(tmp) / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(train_config(
            mode, latency, seed, str(root), max_steps, layout, model_path), sort_keys=False))
        cmd = [sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg_path),
               *(overrides or [])]
        log = Path(tmp) / "console.log"
        with open(log, "wb") as out:
            t_cmd = time.time()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                lines, why = follow(MetricsTail(root).read, lambda: proc.poll() is None, target)
            finally:
                rc, exit_s, ended_by = stop(proc, exit_bound_s)
        console = log.read_text(errors="replace")
        if ended_by != "killed" and rc not in (0, 143):
            raise RuntimeError(f"rollart train ({mode}/{latency}/seed {seed}) exited with "
                               f"{rc}:\n{console[-3000:]}")
        used = _run_dir_layout(root) or {}
        threads = _run_dir_threads(root)
    row = summarize(mode, latency, seed, t_cmd, _as_data(lines, t_cmd), target=target)
    return {**row, "path": "train", "layout": used.get("layout"),
            "layout_why": used.get("why"), "torch_threads": threads,
            "ended_by": ended_by, "followed": why,
            "exit_code": rc, "exit_s": round(exit_s, 2) if ended_by != "itself" else None,
            "overrides": list(overrides or []),
            **({"console_tail": console[-2000:]} if ended_by == "killed" else {})}
