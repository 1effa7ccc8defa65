"""``rollart bench weights``: weight transports on the real pipeline, and the transfer alone.

Pipeline rows: the real training loop (``build_job(in_process=True)``: the torch trainer,
the torch engines serving the rollout behind the LLMProxy, real environments and rewards,
the transport under test moving every version from the trainer to both engines) for
``--steps`` steps of the quickstart (the tiny model) or of SmolLM2-135M
(examples/smollm2.yaml). Per run, from the pipeline's own per-step records:

- ``transfer_s``: the background receive of one version on an engine (slowest engine);
- ``exposed_s``: the whole window the rollout waited for the update: suspend (the engines
  finish their running step), the swap, resume, plus the engines' KV recompute after it;
- ``baseline_s``: the same update with nothing overlapping (the run's first update is
  received only at the suspend point: pull + swap + recompute);
- ``hidden_fraction`` = 1 - exposed / baseline, the paper's "hides 67-78 % of the pull";
- ``GB/s``: version bytes / ``transfer_s``;
- ``wait_s``: the part of ``exposed_s`` spent waiting for a transfer the staleness bound
  did not allow to defer; ``deferred``: suspend points at which the engines went on
  generating on their version while the next one arrived.

``--defer on,off`` runs each row with ``rollout.defer_weight_update`` on (the default:
the swap waits for a later suspend point while the version arrives, as far as alpha
allows) and off (a swap at every suspend point, waiting for the transfer): the same
workload with and without deferral. Medians over the updates after the baseline one,
then each column's median over ``--repeats`` runs; ``load`` is the 1-minute load average
at the start and the end of the row's runs (the machine is shared). Each pipeline run is
a fresh ``python`` process (a run's memory, e.g. a Mooncake segment and two SmolLM2
engines, is returned to the system before the next one starts; repeats do not inherit
each other's state). Every worker of a run shares that process (one machine, no Ray
start-up), so the transports move bytes through their real mechanism (Ray's object store,
a gloo group over TCP, a Mooncake store over TCP) but between threads of one process that
also runs training and rollout on the same cores.

LoRA rows: ``--models smollm2-135m,smollm2-135m-lora`` (or ``tiny-lora``) runs the same
workload with ``trainer.options.lora`` (rank 8, every projection): ``model_mb`` is then the
adapter payload per update, ``transfer_s`` / ``exposed_s`` its time, ``train_s`` the
train step's, against full fine-tuning's in the row before.

Engine rows (``--engine vllm``, ``--paths bytes,collective``): one version into a served
engine by the bytes path against the collective path, per update
(:mod:`rollart_benchmark_suite.weight_paths`); no pipeline or transfer rows then.

Transfer rows (``--transfer-mb``, default 1024): a synthetic state dict of that size
published and received once through each transport, nothing else running: the transport's
own throughput, checksum verification included.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rollart_benchmark_suite import EXAMPLES

TRANSPORTS = ["local", "ray", "nccl", "mooncake"]
MODELS = {"tiny": "quickstart.yaml", "smollm2-135m": "smollm2.yaml",
          "tiny-lora": "quickstart.yaml", "smollm2-135m-lora": "smollm2.yaml"}
# A ``*-lora`` model: the same run training LoRA adapters (rank 8 on every projection,
# trainer.options.lora): the engines receive the adapter only, and merge it.
LORA_OVERRIDES = ["trainer.options.lora.rank=8", "trainer.options.lora.alpha=16"]
PLUGIN_MODULE = {"ray": "rollart_transport_ray", "nccl": "rollart_transport_nccl",
                 "mooncake": "rollart_transport_mooncake"}


def _examples() -> Path:
    return EXAMPLES


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def available(transport: str) -> bool:
    module = PLUGIN_MODULE.get(transport)
    return module is None or importlib.util.find_spec(module) is not None


def _close_transports(job: Any) -> None:
    """Close every transport of an in-process job (a Mooncake master, a store socket)."""
    p = job.pipeline
    for handle in [*p.proxy.workers.values(), *p.trainers]:
        transport = getattr(getattr(handle, "target", None), "transport", None)
        if transport is not None:
            transport.close()


def run_pipeline(transport: str, model: str, steps: int, options: dict[str, Any],
                 defer: bool = True) -> dict[str, Any]:
    """One training run with ``transport``; the weight-sync row from its step records."""
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job
    from rollart_sdk.ray_utils import init_ray

    ray: Any = None
    if transport == "ray":
        import ray

        init_ray(num_cpus=2)
    # Run directories under one root, so that a converted model (root/.models) is reused;
    # each run's own directory (metrics, final checkpoint) is removed after it.
    root = _mkdir(Path(tempfile.gettempdir()) / "rollart-bench-weights")
    overrides = [f"output_dir={root}", f"transport.name={transport}",
                 f"train.steps={steps}", "train.save_final_model=false",
                 "train.checkpoint_every=0", "train.checkpoint_every_s=0",
                 f"rollout.defer_weight_update={str(defer).lower()}"]
    overrides += [f"transport.options.{k}={v}" for k, v in options.items()]
    if model.endswith("-lora"):
        overrides += LORA_OVERRIDES
    cfg, lines = load_config(_examples() / MODELS[model], overrides=overrides)
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    t0 = time.perf_counter()
    try:
        records = run_job(job, steps, progress=False)
    finally:
        _close_transports(job)
        job.close()
        shutil.rmtree(job.run_dir.path, ignore_errors=True)
        if ray is not None:
            ray.shutdown()
    wall = time.perf_counter() - t0
    updates = [r for r in records if r.weight_sync_exposed_s > 0]
    later = updates[1:]  # the first update is the baseline; none after it: no figures
    nbytes = max((r.weight_sync_nbytes for r in updates), default=0)
    baseline = next((r.weight_sync_baseline_s for r in reversed(updates)
                     if r.weight_sync_baseline_s), None)
    transfer = statistics.median(r.weight_transfer_s for r in later) if later else None
    exposed = statistics.median(r.weight_sync_exposed_s for r in later) if later else None
    hidden = [max(0.0, 1 - r.weight_sync_exposed_s / baseline) for r in later] if baseline else []
    return {
        "kind": "pipeline", "transport": transport, "model": model, "defer": defer,
        "model_mb": round(nbytes / 2**20, 2), "steps": len(records), "updates": len(later),
        "wait_s": round(statistics.median(r.weight_sync_wait_s for r in later), 4)
        if later else None,
        "deferred": sum(1 for r in records if r.weight_deferred is not None),
        "train_s": round(statistics.median(r.train_s for r in records[1:] or records), 3),
        "transfer_s": None if transfer is None else round(transfer, 4),
        "exposed_s": None if exposed is None else round(exposed, 4),
        "recompute_s": round(statistics.median(r.weight_recompute_s for r in later), 4)
        if later else None,
        "baseline_s": round(baseline or 0.0, 4),
        "hidden_fraction": round(statistics.median(hidden), 4) if hidden else None,
        "gbps": round(nbytes / transfer / 1e9, 4) if transfer else None,
        "wall_s": round(wall, 1),
    }


_CHILD_MARK = "ROLLART_BENCH_WEIGHTS_ROW "


def run_pipeline_isolated(transport: str, model: str, steps: int, options: dict[str, Any],
                          defer: bool = True) -> dict[str, Any]:
    """:func:`run_pipeline` in a fresh ``python`` process; its row, or an error naming the run.

    The child's stderr passes through (its warnings and errors stay visible); its stdout
    is read for the row (the line it marks) and its last lines are quoted if it fails.
    """
    spec = json.dumps({"transport": transport, "model": model, "steps": steps,
                       "options": options, "defer": defer})
    proc = subprocess.run([sys.executable, "-m", "rollart_benchmark_suite.weights", "--child", spec],
                          stdout=subprocess.PIPE, text=True, check=False)
    rows = [line[len(_CHILD_MARK):] for line in proc.stdout.splitlines()
            if line.startswith(_CHILD_MARK)]
    if proc.returncode != 0 or not rows:
        tail = "\n".join(proc.stdout.splitlines()[-20:])
        raise RuntimeError(f"bench weights: the {transport}/{model} run (defer={defer}) "
                           f"exited with code {proc.returncode} and no row; its last "
                           f"output:\n{tail}")
    row: dict[str, Any] = json.loads(rows[-1])
    return row


class _CountingEngine:
    """Loads nothing: counts the bytes a stager hands over (the transfer is what is timed)."""

    def __init__(self) -> None:
        self.version = 0
        self.nbytes = 0

    async def load_weights(self, buckets: Any, version: int) -> int:
        self.nbytes = sum(b.nbytes for b in buckets)
        self.version = version
        return 0


def synthetic_state(mb: float, tensors: int = 16) -> dict[str, Any]:
    import torch

    per = max(int(mb * 2**20 / 4 / tensors), 1)
    g = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(per, generator=g) for i in range(tensors)}


def transfer_alone(transport: str, mb: float, bucket_mb: float,
                   options: dict[str, Any]) -> dict[str, Any]:
    """Publish one synthetic version and receive it once through ``transport``."""
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.ray_utils import init_ray
    from rollart_sdk.weights import WeightStager, split_buckets

    ray: Any = None
    if transport == "ray":
        import ray

        init_ray(num_cpus=2)
    desc = get_plugins().registry.get("transport", transport)
    sender = desc.create(options, role="sender")
    receiver = desc.create(options, role="receiver")
    state = synthetic_state(mb)
    engine = _CountingEngine()
    stager = WeightStager(receiver)
    try:
        buckets = list(split_buckets(state.items(), int(bucket_mb * 2**20), 1))
        t0 = time.perf_counter()
        manifest = sender.publish(1, buckets)  # push (nccl): returns, the round runs on
        manifest.meta["receivers"] = 1
        publish_s = time.perf_counter() - t0
        stager.start(manifest)
        report = asyncio.run(stager.commit(engine, timeout_s=600))
    finally:
        stager.close()
        receiver.close()
        sender.close()
        if ray is not None:
            ray.shutdown()
    nbytes = engine.nbytes
    return {
        "kind": "transfer", "transport": transport, "model": f"synthetic-{mb:g}MB",
        "model_mb": round(nbytes / 2**20, 2), "publish_s": round(publish_s, 4),
        "transfer_s": round(report.transfer_s, 4), "exposed_s": None, "hidden_fraction": None,
        "gbps": round(nbytes / report.transfer_s / 1e9, 4) if report.transfer_s else None,
    }


def _options(transport: str, model_mb: float | None = None) -> dict[str, Any]:
    if transport == "mooncake" and model_mb:
        # One version kept beside the next: a segment for two synthetic versions.
        return {"keep_versions": 1, "segment_mb": int(model_mb * 2.5) + 64}
    if transport == "nccl":
        return {"backend": "gloo"}
    return {}


MEDIAN_KEYS = ("transfer_s", "exposed_s", "recompute_s", "baseline_s", "hidden_fraction",
               "gbps", "wait_s", "train_s", "wall_s", "deferred")


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs (``*_runs``: every run's value)."""
    row = dict(runs[0])
    for k in MEDIAN_KEYS:
        values = [r[k] for r in runs if r.get(k) is not None]
        row[k] = round(statistics.median(values), 4) if values else None
        row[f"{k}_runs"] = [r.get(k) for r in runs]
    return row


def _load() -> float:
    return round(os.getloadavg()[0], 1)


def run(transports: list[str], models: list[str], steps: int, repeats: int,
        transfer_mb: float, bucket_mb: float,
        defers: tuple[bool, ...] = (True,)) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    skipped = [t for t in transports if not available(t)]
    transports = [t for t in transports if available(t)]
    for model in models:
        for transport in transports:
            for defer in defers:
                load0 = _load()
                runs = [run_pipeline_isolated(transport, model, steps, _options(transport),
                                              defer)
                        for _ in range(repeats)]
                row = median_row(runs)
                row["load"] = [load0, _load()]
                rows.append(row)
                print(json.dumps(row), flush=True)
    if transfer_mb > 0:
        for transport in transports:
            load0 = _load()
            row = median_row([transfer_alone(transport, transfer_mb, bucket_mb,
                                             _options(transport, transfer_mb))
                              for _ in range(repeats)])
            row["load"] = [load0, _load()]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"benchmark": "weights", "steps": steps, "repeats": repeats,
            "defer": list(defers),
            "transfer_mb": transfer_mb, "bucket_mb": bucket_mb, "skipped": skipped,
            "rows": rows}


def _table(result: dict[str, Any]) -> str:
    head = ("kind", "transport", "model", "defer", "model_mb", "transfer_s", "exposed_s",
            "wait_s", "baseline_s", "hidden_fraction", "gbps", "train_s", "load")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in result["rows"]:
        lines.append(" | ".join("" if r.get(k) is None else str(r.get(k)) for k in head))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rollart bench weights``; prints a table, optionally writes JSON."""
    parser = argparse.ArgumentParser(prog="rollart bench weights",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--transports", default=",".join(TRANSPORTS),
                        help="comma-separated transports (default: all four)")
    parser.add_argument("--models", default="tiny,smollm2-135m",
                        help=f"comma-separated models: {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=5, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per row (median)")
    parser.add_argument("--transfer-mb", type=float, default=1024.0,
                        help="synthetic state dict for the transfer-alone rows (0: skip)")
    parser.add_argument("--bucket-mb", type=float, default=64.0,
                        help="trainer bucket size for the transfer-alone rows")
    parser.add_argument("--defer", default="on",
                        help="rollout.defer_weight_update per pipeline row: on, off or on,off")
    parser.add_argument("--engine", default=None,
                        help="engine rows instead: one update into this engine (vllm, "
                        "sglang) per path, by the nccl transport over gloo")
    parser.add_argument("--paths", default="bytes,collective",
                        help="with --engine: bytes, collective or both")
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:  # one pipeline run, in the process run_pipeline_isolated made
        spec = json.loads(args.child)
        row = run_pipeline(spec["transport"], spec["model"], spec["steps"], spec["options"],
                           spec["defer"])
        print(_CHILD_MARK + json.dumps(row), flush=True)
        return 0
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")
    if args.engine:
        return _engine_rows(args, models)
    choices = {"on": True, "off": False}
    defers = [d for d in args.defer.split(",") if d]
    if not defers or any(d not in choices for d in defers):
        parser.error(f"--defer takes on, off or on,off (got {args.defer!r})")
    result = run([t for t in args.transports.split(",") if t], models, args.steps,
                 args.repeats, args.transfer_mb, args.bucket_mb,
                 tuple(choices[d] for d in defers))
    print(_table(result))
    if result["skipped"]:
        print(f"skipped (plugin not installed): {', '.join(result['skipped'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def _engine_rows(args: argparse.Namespace, models: list[str]) -> int:
    from rollart_benchmark_suite.weight_paths import run_paths

    paths = [p for p in args.paths.split(",") if p]
    rows = []
    for model in models:
        load0 = _load()
        for row in run_paths(args.engine, model, paths, args.repeats, args.bucket_mb):
            row["load"] = [load0, _load()]
            rows.append(row)
            print(json.dumps(row), flush=True)
    head = ("engine", "path", "model", "model_mb", "updates", "transfer_s", "exposed_s",
            "update_s", "gbps", "load")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        print(" | ".join(str(r.get(k)) for k in head))
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "weights", "kind": "engine",
                                               "repeats": args.repeats, "rows": rows},
                                              indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
