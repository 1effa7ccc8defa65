"""Calibration: fit the cost models to this machine's torch engine and trainer, then check
that the simulation predicts a real run.

1. :func:`fit_engine` times the real ``torch`` engine on the run's model: batches of B
   forced-length requests (prompt p, M new tokens) and fits, by least squares, the sim's
   step cost ``a + b x sequences + c x tokens`` (step overhead, per-sequence host work,
   2 N / effective FLOP/s): a :class:`~rollart_sdk.sim.costs.HardwareClass` ``cpu-fit``.
2. :func:`fit_trainer` times ``train_step`` of the real ``torch`` trainer on batches of
   several sizes and fits ``a + c x tokens`` (overhead, effective FLOP/s); and times one
   weight export + load into the engine (the sim transport's ``swap_s``). Every timed
   sample has a non-zero advantage, so a trainer that skips zero-advantage samples runs
   them all.
3. :func:`sim_config_for` turns the real run's config into a simulated one: the same
   tasks, rollout and pools, with the fitted classes, and each task's workload measured
   from the real run (turns, tokens per observation and response, env and reward call
   latencies - inputs the sim needs, not what it predicts), and the sim trainer's
   ``skip_zero_advantage`` set as the real trainer's (it then charges only the samples
   whose advantage is not 0, as the torch trainer runs only those). Generation, training and
   step times of the real run are not used: they are what the simulation predicts.
"""

from __future__ import annotations

import asyncio
import copy
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollart_sdk.sim.costs import HardwareClass, ModelSpec

# A calibrated run: tests/sim/test_calibration.py and `rollart bench calibration` (the
# rollart-benchmark-suite package) both run this config.
REAL: dict[str, Any] = {
    "name": "calib",
    "seed": 0,
    "model": {"tiny": {"hidden_size": 256, "num_layers": 4, "num_heads": 4,
                       "intermediate_size": 512, "max_position_embeddings": 512}},
    "pools": [{"name": "gen", "hardware": "cpu", "kind": "gpu", "count": 1},
              {"name": "train", "hardware": "cpu", "kind": "gpu", "count": 1},
              {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 8}],
    "roles": {"actor_train": {"pool": "train"}, "actor_gen": {"pool": "gen", "workers": 1},
              "environment": {"pool": "cpu", "workers": 1}},
    "tasks": [
        {"tag": "FrozenLake",
         "env": {"name": "frozenlake", "options": {"desc": ["SFF", "FHF", "FFG"],
                                                   "obs_format": "compact"}},
         "reward": {"name": "rule", "options": {"mode": "success"}},
         "max_turns": 4, "constrain_actions": True, "system_prompt": None},
        {"tag": "Arithmetic",
         "env": {"name": "arithmetic", "options": {"num_digits": 1, "ops": ["+"]}},
         "reward": {"name": "rule", "options": {"mode": "exact_match"}},
         "max_turns": 1, "system_prompt": None, "sampling": {"max_new_tokens": 32}},
    ],
    "engine": {"name": "torch", "options": {"max_running": 32}},
    # The sim's trainer costs every token of the samples it runs (FLOPs/token); the torch
    # trainer's prefix tree computes shared prefixes once, which the cost model does not
    # describe: the calibrated run computes every token. skip_zero_advantage is modelled
    # (the sim takes the real trainer's setting) but kept off here: with it on, this run
    # trains almost nothing (rewards are nearly all 0) and the step is the rollout, which
    # the sim overestimates (docs/simulation.md, "Calibration").
    "trainer": {"name": "torch", "options": {"lr": 0.001, "micro_batch_size": 16,
                                             "prefix_sharing": "off",
                                             "skip_zero_advantage": False}},
    "transport": {"name": "local"},
    "rollout": {"batch_size": 16, "group_size": 4, "mode": "sync"},
    "train": {"steps": 5, "bucket_mb": 1, "save_final_model": False},
}


def least_squares(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Non-negative-ish least squares by the normal equations (small systems only);
    negative coefficients are clipped to 0 and the rest refitted."""
    k = len(rows[0])
    active = list(range(k))
    while True:
        xs = [[r[i] for i in active] for r in rows]
        coef = _solve(xs, ys)
        if all(c >= 0 for c in coef) or len(active) == 1:
            out = [0.0] * k
            for i, c in zip(active, coef, strict=True):
                out[i] = max(c, 0.0)
            return out
        worst = min(range(len(coef)), key=lambda j: coef[j])
        active.pop(worst)


def _solve(xs: list[list[float]], ys: list[float]) -> list[float]:
    n = len(xs[0])
    a = [[sum(r[i] * r[j] for r in xs) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(xs, ys, strict=True)) for i in range(n)]
    for i in range(n):  # Gauss-Jordan with partial pivoting
        p = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[p], b[i], b[p] = a[p], a[i], b[p], b[i]
        if abs(a[i][i]) < 1e-30:
            raise ValueError("calibration: the measurements do not determine the fit")
        for r in range(n):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [x - f * y for x, y in zip(a[r], a[i], strict=True)]
                b[r] -= f * b[i]
    return [b[i] / a[i][i] for i in range(n)]


def model_spec_of(path: str) -> ModelSpec:
    """The cost model's view of a Hugging Face checkpoint (float32 weights)."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    h, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = h // heads
    embed = cfg["vocab_size"] * h * (1 if cfg.get("tie_word_embeddings", True) else 2)
    per_layer = h * h * 2 + 2 * h * kv * hd + 3 * h * inter
    params = embed + layers * per_layer
    return ModelSpec(params_b=params / 1e9, layers=layers, hidden=h, kv_heads=kv,
                     head_dim=hd, bytes_per_param=4.0)


# ----------------------------------------------------------------------------- engine
async def _time_batch(engine: Any, batch: int, prompt: int, new: int, token: int, k: int) -> float:
    from rollart_sdk.types import GenerationRequest, SamplingParams

    # Rows differ in their last prompt token: an engine that computes identical rows of a
    # step once (the torch engine) would otherwise time one row for the whole batch.
    reqs = [GenerationRequest(f"cal-{k}-{i}", [token] * (prompt - 1) + [i],
                              SamplingParams(max_new_tokens=new, seed=i,
                                             allowed_token_ids=[token]),
                              tag="cal", trajectory_id=f"cal-{k}-{i}") for i in range(batch)]
    t0 = time.perf_counter()
    out = await asyncio.gather(*(engine.generate(r) for r in reqs))
    dt = time.perf_counter() - t0
    if any(len(o.token_ids) != new for o in out):
        raise RuntimeError("calibration: a forced-length request stopped early")
    return dt


def fit_engine(engine: Any, spec: ModelSpec, token: int, repeats: int = 2) -> HardwareClass:
    """Fit ``cpu-fit`` from timed batches on a real engine (see the module docstring)."""
    shapes = [(1, 8, 24), (4, 8, 24), (12, 8, 24), (1, 200, 4), (4, 120, 8), (8, 32, 16)]

    async def measure() -> tuple[list[list[float]], list[float]]:
        rows, ys = [], []
        await _time_batch(engine, 2, 8, 4, token, -1)  # warm-up
        for rep in range(repeats):
            for k, (b, p, m) in enumerate(shapes):
                dt = await _time_batch(engine, b, p, m, token, rep * 100 + k)
                # m steps: one with b prompts of p tokens, m - 1 decoding b sequences.
                rows.append([float(m), float(m * b), float(b * (p + m - 1))])
                ys.append(dt)
        return rows, ys

    rows, ys = asyncio.run(measure())
    a, b, c = least_squares(rows, ys)
    # c is seconds per token: FLOP/s = 2 N / c for this model (memory is not the limit).
    tflops = 2 * spec.params / c / 1e12 if c > 0 else 1e6
    return HardwareClass(tflops=tflops, hbm_tbps=1e6, memory_gb=1e3, mfu=1.0, mbu=1.0,
                         step_overhead_s=a, seq_overhead_s=b, kv_memory_fraction=1.0)


# ----------------------------------------------------------------------------- trainer
def fit_trainer(trainer: Any, spec: ModelSpec, token: int, factor: float = 8.0,
                repeats: int = 2) -> tuple[HardwareClass, float]:
    """(hardware class of the training device, train step overhead seconds)."""
    from rollart_sdk.types import TrainSample

    # Samples differ in their first token: a trainer that computes shared prefixes once
    # (the torch trainer's prefix tree) would otherwise time one sample for the batch.
    def batch(n: int, length: int) -> list[TrainSample]:
        return [TrainSample([token + i] + [token] * (length - 1),
                            [0] * (length // 2) + [1] * (length - length // 2),
                            [-1.0] * length, [0] * length, float(i % 2), f"g{i // 4}")
                for i in range(n)]

    # Rewards 0, 1, 0, 1 in each group of 4: every advantage is +-1, so a trainer that
    # skips zero-advantage samples runs all of them (checked below).
    trainer.train_step(batch(4, 16))  # warm-up
    xs, ys = [], []
    for _ in range(repeats):
        for n, length in [(4, 32), (8, 64), (16, 64), (8, 160)]:
            t0 = time.perf_counter()
            metrics = trainer.train_step(batch(n, length))
            ys.append(time.perf_counter() - t0)
            xs.append([1.0, float(n * length)])
            if metrics.get("forward_sequences", n) != n:
                raise RuntimeError(f"calibration: the trainer ran {metrics['forward_sequences']:g} "
                                   f"of the {n} samples of a timed batch")
    a, c = least_squares(xs, ys)
    flops = factor * spec.params / c if c > 0 else 1e18
    return HardwareClass(tflops=flops / 1e12, hbm_tbps=1e6, memory_gb=1e3, mfu=1.0,
                         mbu=1.0, step_overhead_s=0.0), a


def time_weight_swap(trainer: Any, engine: Any, bucket_mb: float = 1.0) -> float:
    """Seconds to export the trainer's weights and load them into the engine."""
    async def swap() -> None:
        await engine.load_weights(list(trainer.export_weights(int(bucket_mb * 2**20))),
                                  engine.version + 1)

    t0 = time.perf_counter()
    asyncio.run(swap())
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- workload
def measured_workload(run_dir: Path, records: list[Any]) -> dict[str, dict[str, Any]]:
    """Per task, from a real run: turns and token counts (its trained trajectories still
    held: those of the last KEEP_BATCHES steps) and
    mean env reset / step and reward call latencies (its timeline)."""
    spans: dict[tuple[str, str], list[float]] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("tag") and e.get("span") in ("env_reset", "env_step", "reward"):
            spans.setdefault((e["tag"], e["span"]), []).append(e["t1"] - e["t0"])
    out: dict[str, dict[str, Any]] = {}
    trajs = [t for r in records for t in r.batch]
    for tag in sorted({t.tag for t in trajs}):
        mine = [t for t in trajs if t.tag == tag]
        first = [len(t.turns[0].obs_ids) for t in mine]
        later = [len(turn.obs_ids) for t in mine for turn in t.turns[1:]]
        resp = [len(turn.action_ids) for t in mine for turn in t.turns]

        def normal(xs: Sequence[float]) -> dict[str, Any]:
            sd = statistics.pstdev(xs) if len(xs) > 1 else 0.0
            return {"kind": "normal", "mean": statistics.fmean(xs), "std": sd, "min": 1}

        def mean_of(span: str, tag: str = tag) -> float:
            return statistics.fmean(spans.get((tag, span), [0.0]))

        out[tag] = {
            "env": {"turns": normal([len(t.turns) for t in mine]),
                    "reset_s": {"kind": "const", "mean": mean_of("env_reset")},
                    "step_s": {"kind": "const", "mean": mean_of("env_step")},
                    "first_obs_tokens": normal(first),
                    "obs_tokens": normal(later or [1]),
                    "response_tokens": normal(resp),
                    "success": statistics.fmean(1.0 if (t.reward or 0) > 0 else 0.0 for t in mine)},
            "reward_s": mean_of("reward"),
        }
    return out


def sim_config_for(real: dict[str, Any], workload: dict[str, dict[str, Any]],
                   engine_hw: HardwareClass, train_hw: HardwareClass, train_overhead_s: float,
                   swap_s: float, spec: ModelSpec, skip_zero_advantage: bool = False
                   ) -> dict[str, Any]:
    """The real run's config (``data``) with the sim backends and fitted costs;
    ``skip_zero_advantage``: whether the real trainer skips zero-advantage samples."""
    data = copy.deepcopy(real)
    train_pool = data.get("roles", {}).get("actor_train", {}).get("pool")
    for p in data["pools"]:
        if p.get("kind", "gpu") != "gpu":
            continue
        p["hardware"] = "cpu-train" if p["name"] == train_pool else "cpu-fit"
    data["clock"] = "simulated"
    data["sim"] = {"model": spec.model_dump(), "hardware": {
        "cpu-fit": engine_hw.model_dump(), "cpu-train": train_hw.model_dump()}}
    max_running = data.get("engine", {}).get("options", {}).get("max_running", 16)
    data["engine"] = {"name": "sim", "options": {"max_running": max_running}}
    data["trainer"] = {"name": "sim", "options": {"devices": 1,
                                                  "step_overhead_s": train_overhead_s,
                                                  "skip_zero_advantage": skip_zero_advantage}}
    data["transport"] = {"name": "sim", "options": {"publish_gbps": 1e6, "pull_gbps": 1e6,
                                                    "store_gbps": 1e6, "swap_s": swap_s}}
    for t in data["tasks"]:
        w = workload[t["tag"]]
        t["env"] = {"name": "sim", "options": w["env"]}
        t["reward"] = {"name": "sim", "options": {
            "warm_s": {"kind": "const", "mean": w["reward_s"]},
            "cold_s": {"kind": "const", "mean": 0.0}}}
        t.pop("constrain_actions", None)
        t.pop("system_prompt", None)
    return data


# ----------------------------------------------------------------------------- the check
def calibration_check(real_data: dict[str, Any], steps: int, out_dir: str,
                      token: int = 10) -> dict[str, Any]:
    """Run ``real_data`` for real (in process), fit the cost models on fresh instances of
    its engine and trainer, simulate the same run, and compare mean step times (the
    first step, which includes start-up, excluded): the error of the median step time."""
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.sim.job import build_sim_job, run_sim, step_times

    data = copy.deepcopy(real_data)
    data["output_dir"] = str(Path(out_dir) / "real")
    cfg, lines = load_config(data=data)
    logged: list[str] = []
    job = build_job(cfg, lines, in_process=True, log=logged.append)
    try:
        run_job(job, steps, progress=False)
    finally:
        job.close()
    metrics = [json.loads(x) for x in (job.run_dir.path / "metrics.jsonl").read_text().splitlines()]
    real_steps = step_times(metrics)[1:]
    workload = measured_workload(job.run_dir.path, job.pipeline.records)

    model_path = next(x.split(": ", 1)[1] for x in logged if x.startswith("model: "))
    spec = model_spec_of(model_path)
    reg = get_plugins().registry
    from rollart_sdk.config import ModelConfig

    model = ModelConfig(path=model_path)
    engine = reg.get("engine", cfg.engine.name).create(cfg.engine.options, model=model)
    trainer = reg.get("trainer", cfg.trainer.name).create(
        cfg.trainer.options, model=model, rank=0, world_size=1, init_method=None)
    engine_hw = fit_engine(engine, spec, token)
    train_hw, train_overhead = fit_trainer(trainer, spec, token)
    swap = time_weight_swap(trainer, engine)

    # The torch trainer skips zero-advantage samples unless a KL term needs them.
    skip = (bool(getattr(getattr(trainer, "options", None), "skip_zero_advantage", False))
            and getattr(trainer, "ref_model", None) is None)
    sim_data = sim_config_for(real_data, workload, engine_hw, train_hw, train_overhead, swap,
                              spec, skip)
    sim_data["output_dir"] = str(Path(out_dir) / "sim")
    scfg, _ = load_config(data=sim_data)
    sjob = build_sim_job(scfg, log=lambda *a: None)
    run_sim(sjob, steps)
    sim_steps = step_times(sjob.metrics)[1:]
    # Medians: a load spike from other processes on a shared machine moves a step or two.
    real_med, sim_med = statistics.median(real_steps), statistics.median(sim_steps)
    return {"real_step_s": real_steps, "sim_step_s": sim_steps, "real_median_s": real_med,
            "sim_median_s": sim_med, "error": sim_med / real_med - 1,
            "engine": engine_hw.model_dump(), "trainer": train_hw.model_dump(),
            "train_overhead_s": train_overhead, "swap_s": swap,
            "model_params": spec.params, "workload": workload}
