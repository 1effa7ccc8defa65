"""``rollart bench small`` (issue 12): what it runs and how it reads a run. No speed
thresholds here: the figures are the benchmark's business (docs/benchmarks.md)."""

from __future__ import annotations

import json
import sys

import pytest
from rollart_benchmark_suite.small import (
    LATENCY,
    TAG,
    LatencyFrozenLake,
    latency_figures,
    latency_floor,
    median_rows,
    summarize,
    workload_config,
)

from rollart_sdk.cli import main
from rollart_sdk.config import load_config


def _metrics(successes, t0=100.0, step_s=2.0):
    return [{"t": t0 + step_s * (i + 1), "cpu": 1.0 + i, f"success/{TAG}": s,
             f"count/{TAG}": 64, f"turns/{TAG}": 5, "time/get_batch_wait": 1.0,
             "time/train": 0.5, "time/weight_sync": 0.01, "train_tokens": 900,
             "trajectories/aborted_stale": 0} for i, s in enumerate(successes)]


def test_target_is_the_first_window_of_five_at_0_7():
    succ = [0.1, 0.5, 0.6, 0.8, 0.9, 0.6, 0.7, 0.9, 1.0]
    data = {"t_start": 90.0, "t_ready": 100.0, "cpu_ready": 1.0, "metrics": _metrics(succ)}
    row = summarize("sync", "none", 3, 80.0, data)
    # windows of 5: 0.58 (step 5), 0.68 (step 6), 0.72 (step 7): the target is step 7
    assert row["reached"] and row["steps_to_target"] == 7
    assert row["time_to_target_s"] == pytest.approx(100.0 + 7 * 2.0 - 80.0)
    assert row["time_to_target_after_startup_s"] == pytest.approx(14.0)
    assert row["episodes_per_s"] == pytest.approx(7 * 64 / 14.0, abs=0.1)
    assert row["startup_s"] == 20.0 and row["seed"] == 3 and not row["collapsed"]
    assert row["first_success_step"] == 1 and row["success_per_step"] == succ


def test_the_target_reads_the_success_of_every_finished_episode_where_there_is_one():
    """Async: the batch (what was trained) holds more of the short episodes, and its
    success/<tag> can read low; the rule reads success_finished/<tag> (every episode that
    ended in the step), and the row keeps the batch's beside it."""
    batch = [0.1, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]
    finished = [0.1, 0.6, 0.7, 0.8, 0.8, 0.8, 0.8, 0.8]
    m = _metrics(batch)
    for line, f in zip(m, finished, strict=True):
        line[f"success_finished/{TAG}"] = f
    row = summarize("async", "normal", 0, 90.0, {"t_ready": 100.0, "metrics": m})
    # finished: windows of 5 from step 5: 0.6, 0.74 (step 6); the batch's never reach 0.7
    assert row["reached"] and row["steps_to_target"] == 6
    assert row["success_per_step"] == finished and row["success_batch_per_step"] == batch
    assert row["trained_to_target"] == 6 * 64
    del m[-1][f"success_finished/{TAG}"]  # a line without one: the batch's
    assert summarize("async", "normal", 0, 90.0, {"t_ready": 100.0, "metrics": m})[
        "success_per_step"][-1] == 0.6


def test_first_success_step_counts_the_steps_without_any_signal():
    succ = [0.0, 0.0, 0.0, 0.02, 0.0, 0.3]
    data = {"t_start": 0.0, "t_ready": 1.0, "cpu_ready": 1.0, "metrics": _metrics(succ)}
    assert summarize("sync", "none", 0, 0.0, data)["first_success_step"] == 4
    data["metrics"] = _metrics([0.0] * 6)
    assert summarize("sync", "none", 0, 0.0, data)["first_success_step"] is None


def test_a_collapse_is_flagged_and_a_miss_has_no_target_time():
    succ = [0.2, 0.5, 0.6, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0]
    data = {"t_start": 0.0, "t_ready": 100.0, "cpu_ready": 1.0, "metrics": _metrics(succ)}
    row = summarize("async", "normal", 0, 90.0, data)
    assert not row["reached"] and row["time_to_target_s"] is None
    assert row["collapsed"] and row["final_success_5"] == 0.0
    table = median_rows([row])
    assert table[0]["collapsed"] == 1 and table[0]["reached"] == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("latency", list(LATENCY))
def test_every_variant_is_a_valid_run_config(tmp_path, mode, latency):
    cfg, _ = load_config(data=workload_config(mode, latency, 0, str(tmp_path), 60))
    task = cfg.tasks[0]
    assert task.max_turns == 8 and task.constrain_actions and cfg.rollout.batch_size == 64
    # Envs that sleep must not sleep on the control plane's event loop.
    assert task.env_host == ("inline" if latency == "none" else "thread")
    assert cfg.rollout.alpha == 1


@pytest.mark.timeout(900)  # two fresh processes, each building a model: minutes when loaded
def test_bench_small_runs_end_to_end(tmp_path):
    out = tmp_path / "small.json"
    rc = main(["bench", "small", "--modes", "sync", "--latency", "none", "normal",
               "--seeds", "0", "--max-steps", "2", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    # Both variants ran: inline envs, and sleeping envs on the run's threads.
    none, normal = data["rows"]
    for row in (none, normal):
        for key in ("mode", "latency", "time_to_target_s", "steps_to_target",
                    "episodes_per_s", "seed"):
            assert key in row
        assert row["mode"] == "sync" and row["steps"] == 2
        assert row["episodes_per_s"] > 0 and row["startup_s"] > 0
    assert (none["latency"], normal["latency"]) == ("none", "normal")
    assert "loadavg_before" in data and [m["runs"] for m in data["median"]] == [1, 1]


def test_reference_advantages_are_trl_group_scaling():
    from rollart_benchmark_suite.small_reference import _advantages

    # One success in a group of 8: mean 0.125, Bessel std sqrt(0.125) = 0.35355.
    adv = _advantages([1.0] + [0.0] * 7 + [0.0] * 8)
    assert adv[0] == pytest.approx(0.875 / (0.35355339 + 1e-4), rel=1e-6)
    assert adv[1] == pytest.approx(-0.125 / (0.35355339 + 1e-4), rel=1e-6)
    assert adv[8:] == [0.0] * 8  # a group that all failed carries no signal


@pytest.mark.timeout(600)
def test_reference_trainer_runs_the_same_workload(tmp_path):
    """The synchronous single-process reference: a real run of 2 steps through the same
    summary as rollart's runs; its episodes are the workload's (64 per step, at most 8
    turns, the token layout of rollart's ChatFormat)."""
    from rollart_benchmark_suite import small_reference as ref

    seen = []
    original = ref._rollout

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append(out)
        return out

    ref._rollout = spy
    try:
        data = ref.reference_child("none", 0, 2, str(tmp_path / "unused.json"))
    finally:
        ref._rollout = original
    row = summarize("reference", "none", 0, data["t_start"], data)
    assert row["steps"] == 2 and row["episodes_per_s"] > 0 and row["alpha"] == 0
    seqs, masks, rewards, turns, floor = seen[0]
    assert floor == 0.0  # no latency: nothing slept
    assert len(seqs) == 64 and all(1 <= t <= 8 for t in turns)
    for ids, mask, t in zip(seqs, masks, turns, strict=True):
        assert len(ids) == len(mask) and sum(mask) == t  # one action token per turn
        # 44 prompt tokens, then per turn 1 action + 46 tokens of the next observation
        # (none after the last action).
        assert len(ids) == 44 + t + 46 * (t - 1)
    assert set(rewards) <= {0.0, 1.0}


def test_latency_env_reports_what_each_episode_slept():
    env = LatencyFrozenLake(mu=0.004, sigma=0.002, map_name="4x4", is_slippery=False,
                            obs_format="compact")
    env.reset(seed=5)
    slept = []
    for action in ("Right", "Right", "Down"):
        *_, info = env.step(action)
        slept.append(info["last_sleep_s"])
        assert info["env_sleep_s"] == pytest.approx(sum(slept))
    assert all(x >= 0 for x in slept) and sum(slept) > 0
    env.reset(seed=5)  # a new episode starts from 0, with the same draws for that seed
    *_, info = env.step("Right")
    assert info["env_sleep_s"] == pytest.approx(slept[0])
    flat = LatencyFrozenLake(map_name="4x4", is_slippery=False, obs_format="compact")
    flat.reset(seed=0)
    assert flat.step("Down")[4]["env_sleep_s"] == 0.0


def test_latency_floor_sync_is_the_slowest_episode_async_the_spread_sum():
    from types import SimpleNamespace

    batch = [SimpleNamespace(info={"env_sleep_s": x}) for x in (0.1, 0.45, 0.2)]
    batch.append(SimpleNamespace(info={}))  # an episode without the figure slept nothing
    fig = latency_figures(batch)
    assert fig == {"slowest_episode_sleep_s": 0.45, "episode_sleep_s_sum": pytest.approx(0.75)}
    steps = [fig, {"slowest_episode_sleep_s": 0.3, "episode_sleep_s_sum": 1.25}]
    assert latency_floor("sync", steps, 64) == pytest.approx(0.75)
    assert latency_floor("reference", steps, 64) == pytest.approx(0.75)
    assert latency_floor("async", steps, 4) == pytest.approx(2.0 / 4)
    assert latency_floor("sync", [{"t": 1.0}], 64) is None  # runs recorded before the figure


def test_summary_floor_counts_the_steps_up_to_the_target():
    succ = [0.8] * 7
    metrics = _metrics(succ)
    for i, m in enumerate(metrics):
        m.update(slowest_episode_sleep_s=0.5 + i, episode_sleep_s_sum=10.0)
    data = {"t_start": 0.0, "t_ready": 1.0, "cpu_ready": 1.0, "metrics": metrics,
            "concurrency": 128}
    row = summarize("sync", "normal", 0, 0.0, data)
    assert row["steps_to_target"] == 5
    assert row["latency_floor_s"] == pytest.approx(0.5 + 1.5 + 2.5 + 3.5 + 4.5)
    assert row["latency_floor_s_per_step"] == pytest.approx(12.5 / 5, abs=1e-3)
    assert summarize("async", "normal", 0, 0.0, data)["latency_floor_s"] == pytest.approx(
        50.0 / 128, abs=0.01)


def test_set_overrides_are_checked_before_any_run(capsys):
    rc = main(["bench", "small", "--modes", "sync", "--latency", "none", "--seeds", "0",
               "--set", "rollout.redundancy=-1"])
    assert rc == 2
    err = capsys.readouterr()
    assert "redundancy" in err.out + err.err


def test_reference_updates_per_batch_is_trls_num_iterations():
    """updates > 1: more AdamW steps on the batch, the first one the single update's
    exactly; later ones clip the ratio to the first pass at 1 +- 0.2 (TRL's epsilon)."""
    import copy

    import torch
    from rollart_benchmark_suite.small import reference_updates
    from rollart_benchmark_suite.small_reference import _train_step
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2))
    seqs = [[1, 2, 3, 4], [1, 2, 5, 6, 7], [1, 2, 3, 8], [1, 2, 9]] * 2
    masks = [[0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 1]] * 2
    rewards = [1.0, 0.0, 1.0, 0.0] * 2

    def trained(updates, lr=0.05):
        m = copy.deepcopy(model)
        after: list[list[torch.Tensor]] = []  # the weights after each AdamW step

        class Spy(torch.optim.AdamW):
            def step(self, *args, **kwargs):
                out = super().step(*args, **kwargs)
                after.append([p.detach().clone() for p in m.parameters()])
                return out

        _train_step(m, Spy(m.parameters(), lr=lr), seqs, masks, rewards, updates)
        return m, after

    one, after1 = trained(1)
    two, after2 = trained(2)
    assert len(after1) == 1 and len(after2) == 2
    assert all(torch.equal(a, b) for a, b in zip(after1[0], after2[0], strict=True))
    diff = [float((a - b).abs().max()) for a, b in zip(one.parameters(), two.parameters(),
                                                       strict=True)]
    assert max(diff) > 0  # the second update moved the weights further
    # reference_updates reads only that key from --set (the rest describe rollart)
    assert reference_updates(None) == 1
    assert reference_updates(["trainer.options.updates_per_batch=2", "rollout.alpha=0"]) == 2


def test_trl_mode_without_trl_says_how_to_install_it(monkeypatch):
    """--modes trl where TRL is not installed: one clear error before any run starts (what
    is missing, where, and the commands that fix it), not a failed run per seed."""
    import importlib.util

    from rollart_benchmark_suite import small

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "trl" else real(name, *a))
    started = []
    monkeypatch.setattr(small, "run_one", lambda *a, **k: started.append(a))
    with pytest.raises(SystemExit) as err:
        small.main(["--modes", "sync", "trl", "--repeats", "1"])
    assert started == []
    msg = str(err.value)
    assert "has no `trl`" in msg and sys.executable in msg
    assert f"pip install -c constraints.txt trl=={small.TRL_VERSION}" in msg
    assert "bench small --modes trl" in msg


def test_latency_env_options_refuse_an_unknown_key():
    """``bench-frozenlake`` takes ``mu``/``sigma`` plus any ``frozenlake`` option; a typo
    fails when the config is checked, naming the key."""
    from pydantic import ValidationError
    from rollart_benchmark_suite.small import LatencyFrozenLakeOptions

    ok = LatencyFrozenLakeOptions(mu=0.05, sigma=0.02, desc=["SFF", "FHF", "FFG"])
    assert ok.mu == 0.05 and ok.model_extra == {"desc": ["SFF", "FHF", "FFG"]}
    with pytest.raises(ValidationError, match="dsec"):
        LatencyFrozenLakeOptions(mu=0.05, dsec=["SFF"])
