"""The real control plane on virtual time: a tiny deterministic job's step times equal
the sum of its modelled costs; trajectory-level interaction beats batched when env
latencies spread and ties when they do not; `rollart sim` writes a run directory."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.config import load_config
from rollart_sdk.sim import workloads as W
from rollart_sdk.sim.costs import HARDWARE, MODELS, engine_step_s, prefill_pairs, train_step_s
from rollart_sdk.sim.job import build_sim_job, engine_stats, run_sim, simulate, step_times
from rollart_sdk.testing.dists import run_cli

P, N = 1000, 200  # prompt tokens, response tokens
RESET, STEP, WARM, COLD = 2.0, 3.0, 0.01, 1.0


def tiny(tmp_path, **rollout) -> dict:
    task = {"tag": "T", "env": {"name": "sim", "options": {
        "turns": W.dist(mean=1), "reset_s": W.dist(mean=RESET), "step_s": W.dist(mean=STEP),
        "first_obs_tokens": W.dist(mean=P), "response_tokens": W.dist(mean=N)}},
        "reward": {"name": "sim", "options": {"warm_s": W.dist(mean=WARM),
                                              "cold_s": W.dist(mean=COLD)}},
        "max_context_tokens": 100_000, "sampling": {"max_new_tokens": 10_000}}
    data = W.base([task], {"H800": (1, 1)}, train_gpus=8, batch=1, group=1, mode="sync")
    data["rollout"].update(rollout)
    data["output_dir"] = str(tmp_path)
    return data


def test_virtual_step_time_is_the_sum_of_modelled_costs(tmp_path):
    cfg, _ = load_config(data=tiny(tmp_path))
    job = build_sim_job(cfg, log=lambda *a: None)
    run_sim(job, 3)
    h800, spec = HARDWARE["H800"], MODELS["qwen3-8b"]
    generate = (engine_step_s(h800, 1, spec, P, prefill_pairs(P, 0), 0, 0.0)
                + (N - 1) * engine_step_s(h800, 1, spec, 0, 0.0, 1, P + 1 + (N - 1) / 2))
    train = train_step_s(h800, 8, spec, [P + N])
    w = spec.weight_bytes
    publish, pull, swap = w * 8 / 200e9, w * 8 / 400e9, 0.5
    after_rollout = train + publish + pull + swap  # sync: train, publish, pull, load
    times = step_times(job.metrics)  # metrics.jsonl keeps milliseconds
    assert times[0] == pytest.approx(RESET + generate + STEP + COLD + WARM + after_rollout, abs=2e-3)
    assert times[1] == pytest.approx(RESET + generate + STEP + WARM + after_rollout, abs=2e-3)
    assert times[2] == pytest.approx(times[1], abs=2e-3)
    assert job.virtual_s == pytest.approx(sum(times), abs=5e-3)
    assert job.metrics[0]["time/train"] == pytest.approx(train, abs=1e-3)
    assert job.metrics[1]["weight_sync/exposed_s"] == pytest.approx(pull + swap, abs=1e-3)


def _straggler(sigma: float) -> float:
    task = W.frozenlake(step_mu=10.0, step_sigma=sigma, turns=5, response=W.dist(mean=100))
    out = {}
    for inter in ("batched", "trajectory"):
        data = W.base([task], {"H800": (2, 1)}, mode="sync", interaction=inter, batch=32)
        out[inter] = simulate(data, steps=2, warmup=0).rollout_s
    return out["batched"] / out["trajectory"]


def test_trajectory_level_beats_batched_when_env_latency_spreads_and_ties_without():
    assert _straggler(0.0) == pytest.approx(1.0, abs=0.01)
    assert _straggler(5.0) > 1.15


def test_rollart_sim_writes_metrics_events_and_summary(tmp_path):
    import yaml

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny(tmp_path)))
    res = run_cli("sim", str(cfg_path), "--steps", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["clock"] == "simulated" and summary["trained"] == 2
    spans = {json.loads(line)["span"] for line in (run / "events.jsonl").read_text().splitlines()}
    assert {"env_reset", "generate", "env_step", "reward", "train"} <= spans
    # `clock: simulated` makes `rollart train` run it on simulated time too: the same
    # build_job and outcome lines, no layout to choose, and no checkpoint to resume from.
    res = run_cli("train", str(cfg_path), "--steps", "1")
    assert res.returncode == 0 and "simulated 1 steps" in res.stdout, res.stdout + res.stderr
    assert "rollout: " in res.stdout and "layout:" not in res.stdout, res.stdout
    res = run_cli("train", str(cfg_path), "--resume", str(run))
    assert res.returncode == 2 and "--resume" in res.stderr, res.stdout + res.stderr
    assert "simulated time (clock: simulated) keeps no checkpoints" in res.stderr, res.stderr
    # `rollart validate` picks the same runtime: the sim's checks, no layout.
    res = run_cli("validate", str(cfg_path))
    assert res.returncode == 0 and "is valid" in res.stdout, res.stdout + res.stderr
    assert "layout:" not in res.stdout, res.stdout
    # A config that names a real backend is refused with the key to change.
    bad = tiny(tmp_path)
    bad["engine"] = {"name": "torch"}
    cfg_path.write_text(yaml.safe_dump(bad))
    res = run_cli("sim", str(cfg_path))
    assert res.returncode == 2 and "engine.name" in res.stderr and "sim" in res.stderr


def test_sim_trainer_with_skip_zero_advantage_charges_only_the_samples_it_would_run():
    """The torch trainer's ``skip_zero_advantage``: a sample whose GRPO advantage is 0 is
    not run, so the sim charges the others only (off: every sample)."""
    from rollart_sdk.sim.backends import SimTrainer
    from rollart_sdk.types import TrainSample

    def sample(n, reward, group, advantage=None):
        return TrainSample([2] * n, [1] * n, [0.0] * n, [0] * n, reward, group,
                           advantage=advantage)

    batch = [sample(10, 0.0, "flat"), sample(20, 0.0, "flat"),      # all equal: 0
             sample(30, 0.0, "mixed"), sample(40, 1.0, "mixed"),    # +-: run
             sample(50, 1.0, "alone"),                              # group of one: 0
             sample(60, 0.5, "mid"), sample(70, 0.0, "mid"), sample(80, 1.0, "mid"),
             sample(90, 1.0, "set", advantage=0.0), sample(100, 1.0, "set2", advantage=0.7)]
    h800, spec = HARDWARE["H800"], MODELS["qwen3-8b"]
    skip = SimTrainer(8, skip_zero_advantage=True, hardware=h800, model_spec=spec)
    plain = SimTrainer(8, hardware=h800, model_spec=spec)
    run = skip.samples_run(batch)
    # "mid": 0.5 is its group's mean, so its advantage is exactly 0 as well.
    assert [len(s.input_ids) for s in run] == [30, 40, 70, 80, 100]
    assert plain.samples_run(batch) == batch
    assert skip.step_s([len(s.input_ids) for s in run]) == pytest.approx(
        train_step_s(h800, 8, spec, [30, 40, 70, 80, 100]))


@pytest.mark.parametrize("success", [0.0, 1.0])
def test_a_sim_run_whose_groups_all_score_alike_trains_nothing_with_skip(tmp_path, success):
    """Every group all-fail (or all-succeed): with ``skip_zero_advantage`` a step costs
    its overhead only and reports no sample run; without it, every sample is charged."""
    out = {}
    for skip in (False, True):
        data = tiny(tmp_path / f"{skip}")
        data["rollout"].update(batch_size=4, group_size=2)
        data["tasks"][0]["env"]["options"]["success"] = success
        data["trainer"]["options"].update(skip_zero_advantage=skip, step_overhead_s=0.25)
        cfg, _ = load_config(data=data)
        job = build_sim_job(cfg, log=lambda *a: None)
        run_sim(job, 2)
        out[skip] = job.metrics
    assert len(out[False]) == len(out[True]) == 2  # one metrics row per step
    full = train_step_s(HARDWARE["H800"], 8, MODELS["qwen3-8b"], [P + N] * 4, overhead_s=0.25)
    for m in out[False]:
        assert m["time/train_compute"] == pytest.approx(full, abs=1e-3)
        assert m["train/forward_sequences"] == 4
    for m in out[True]:
        assert m["time/train_compute"] == pytest.approx(0.25, abs=1e-3)
        assert m["train/forward_sequences"] == 0 and m["train/forward_tokens"] == 0


def test_pd_step_time_is_prefill_then_kv_transfer_then_decode(tmp_path):
    """The tiny job with roles.actor_gen.prefill/decode: the real LLMProxy sends the
    prompt to the sim prefill engine, its K/V cross the link, the decode engine decodes;
    the generation span is the prefill step + the transfer + the remaining decode steps."""
    data = tiny(tmp_path)
    data["pools"][0]["count"] = 8 + 2  # the trainer's 8 H800 + one prefill, one decode
    data["roles"]["actor_gen"].update(prefill={"pool": "H800", "workers": 1},
                                      decode={"pool": "H800", "workers": 1})
    cfg, _ = load_config(data=data)
    job = build_sim_job(cfg, log=lambda *a: None)
    run_sim(job, 2)
    h800, spec = HARDWARE["H800"], MODELS["qwen3-8b"]
    prefill = engine_step_s(h800, 1, spec, P, prefill_pairs(P, 0), 0, 0.0)
    transfer = P * spec.kv_bytes_per_token * 8 / 200e9
    decode = (N - 1) * engine_step_s(h800, 1, spec, 0, 0.0, 1, P + 1 + (N - 1) / 2)
    train = train_step_s(h800, 8, spec, [P + N])
    w = spec.weight_bytes
    after_rollout = train + w * 8 / 200e9 + w * 8 / 400e9 + 0.5
    times = step_times(job.metrics)
    assert times[1] == pytest.approx(RESET + prefill + transfer + decode + STEP + WARM
                                     + after_rollout, abs=2e-3)
    stats = {e.name: engine_stats(e) for e in job.engines}
    assert stats["gen-prefill-0"]["prefill_tokens"] == 2 * P
    assert stats["gen-prefill-0"]["decode_tokens"] == 0
    assert stats["gen-0"]["prefill_tokens"] == 0 and stats["gen-0"]["decode_tokens"] > 0
    assert set(job.pipeline.proxy.served) == {("T", "gen-0")}
