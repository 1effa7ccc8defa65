"""Samples and action diagnostics of every run (issue #38): samples.jsonl holds, per step
and task, whole trajectories whose turns are exactly the ids the engine was given and
produced, with the reward's details; `rollart samples` prints them; a constrained task's
allowed mass reaches metrics.jsonl and, when it collapses, the console once."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_pipeline import record_prompts, run, single_task, test_envs  # noqa: F401 - fixture

from rollart_sdk.cli import main
from rollart_sdk.control.diagnostics import ActionWatch
from rollart_sdk.control.samples import SampleLog, read_samples, spread
from rollart_sdk.types import Trajectory, Turn


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    """One in-process run of the two-task config (FrozenLake constrained), 3 steps, every
    engine request recorded, the warning threshold raised so that it fires."""
    import rollart_sdk.control.diagnostics as diagnostics

    tmp = tmp_path_factory.mktemp("samples")
    before = diagnostics.ALLOWED_MASS_WARN, diagnostics.UNIFORM_FACTOR
    # any mass is "collapsed": the warning must show
    diagnostics.ALLOWED_MASS_WARN, diagnostics.UNIFORM_FACTOR = 1.01, 1e9
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            job, records = run(tmp, ["train.samples_per_task=2"], steps=3,
                               prepare=record_prompts)
    finally:
        diagnostics.ALLOWED_MASS_WARN, diagnostics.UNIFORM_FACTOR = before
    return job, records, err.getvalue()


def test_samples_are_what_the_engine_was_given(sampled_run):
    job, records, _ = sampled_run
    rows = read_samples(job.run_dir.path)
    trained = [r for r in rows if r["outcome"] == "trained"]
    # Two per task and step, spread over the batch's rewards (lowest and highest).
    for step in (1, 2, 3):
        for tag in ("FrozenLake", "Arithmetic"):
            mine = [r for r in trained if r["step"] == step and r["tag"] == tag]
            assert len(mine) == 2, (step, tag, len(mine))
            batch = [t for t in records[step - 1].batch if t.tag == tag]
            rewards = sorted(t.reward for t in batch)
            assert sorted(r["reward"] for r in mine) == [rewards[0], rewards[-1]]
    tasks = job.pipeline.scheduler.tasks
    for row in trained:
        tok = tasks[row["tag"]].prompt_format.tok
        context: list[int] = []
        for k, turn in enumerate(row["turns"]):
            context += turn["observation_ids"]
            prompt, produced = job.prompts[f"{row['trajectory']}/t{k}"]
            # the rendered turn is the decode of exactly the ids the engine was prompted
            # with (this turn's part of them) and the ids it returned
            assert context == prompt, (row["trajectory"], k)
            assert turn["action_ids"] == produced
            assert turn["observation"] == tok.decode(turn["observation_ids"],
                                                     skip_special_tokens=False)
            assert turn["action"] == tok.decode(produced, skip_special_tokens=False)
            context += produced
        # the reward with its details, the env's info, versions and staleness
        assert row["reward_details"]["mode"] in ("success", "exact_match"), row
        assert "reward_details" not in row["info"]
        assert row["versions"] and row["staleness"] in (0, 1)
        assert row["trainer_staleness"] >= row["staleness"]
        assert row["constrained"] == (row["tag"] == "FrozenLake")
    for row in (r for r in rows if r["outcome"] == "dropped"):
        assert row["dropped"] and "staleness" not in row


def test_allowed_mass_and_invalid_actions_reach_metrics(sampled_run):
    job, _, _ = sampled_run
    lines = [json.loads(x) for x in (job.run_dir.path / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        # FrozenLake is constrained: its mass is measured; Arithmetic is not
        assert 0.0 < m["allowed_mass/FrozenLake"] <= 1.0
        assert m["train/allowed_mass_min"] <= m["train/allowed_mass_mean"]
        assert "allowed_mass/Arithmetic" not in m
        assert m["allowed_mass_uniform/FrozenLake"] == pytest.approx(
            4 / len(job.pipeline.scheduler.tasks["FrozenLake"].prompt_format.tok))
        # the arithmetic env judges every reply (a tiny model's rarely holds a number)
        assert 0.0 <= m["invalid_action/Arithmetic"] <= 1.0


def test_collapsed_allowed_mass_is_warned_once(sampled_run):
    _, _, err = sampled_run
    assert err.count("warning: task FrozenLake: at step 1 the policy puts") == 1, err
    assert "outside the action vocabulary" in err


def test_action_watch_threshold():
    w = ActionWatch()
    assert w.check({"step": 1, "allowed_mass/A": 0.5, "allowed_mass/B": float("nan")}) == []
    (line,) = w.check({"step": 2, "allowed_mass/A": 1e-32, "allowed_mass/B": 0.9})
    assert line.startswith("task A: at step 2") and "puts less than 1e-30 of" in line
    assert w.check({"step": 3, "allowed_mass/A": 0.0}) == []  # once per task
    # a model from scratch (mass near the uniform share, 4 of 100 ids): no warning;
    # far below it (issue #38: 1e-32 on 12 of 49152 ids): a warning naming the share
    assert ActionWatch().check({"allowed_mass/A": 0.03, "allowed_mass_uniform/A": 0.04}) == []
    (line,) = ActionWatch().check({"allowed_mass/A": 1e-32,
                                   "allowed_mass_uniform/A": 12 / 49152})
    assert "no preference would put 0.00024 there" in line
    # a trainer without the per-task split (Megatron): the overall mean
    assert len(ActionWatch().check({"step": 1, "train/allowed_mass_mean": 0.01})) == 1


def test_rollart_samples_prints_them(sampled_run, capsys):
    job, records, _ = sampled_run
    run_dir = job.run_dir.path
    assert main(["samples", str(run_dir), "--task", "FrozenLake", "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("step 2  task FrozenLake") == 2 and "task Arithmetic" not in out
    assert "--- turn 1: observation" in out and "--- turn 1: action" in out
    assert "reward details: {\"mode\": \"success\"" in out and "constrained actions" in out
    assert "staleness" in out and "2 of" in out
    # --worst: the lowest reward first; --best: the highest
    assert main(["samples", str(run_dir), "--trained", "--worst", "-n", "1"]) == 0
    worst = capsys.readouterr().out
    assert main(["samples", str(run_dir), "--trained", "--best", "-n", "1"]) == 0
    best = capsys.readouterr().out
    rewards = [t.reward for r in records for t in r.batch]
    assert f"reward {min(rewards):.3g}," in worst and f"reward {max(rewards):.3g}," in best
    # a filter that matches nothing says what there is
    assert main(["samples", str(run_dir), "--task", "Nope"]) == 2
    assert "tasks: Arithmetic, FrozenLake" in capsys.readouterr().err


def _traj(i: int, reward: float | None, dropped: str | None = None) -> Trajectory:
    t = Trajectory(f"T-{i}", "T", "g", 0, turns=[Turn([1, 2], [3], [0.0], [0])])
    t.reward, t.dropped = reward, dropped
    return t


def test_sample_log_is_bounded_and_thins_out(tmp_path):
    dec = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: " ".join(map(str, ids)))
    rec = lambda step: SimpleNamespace(step=step, batch=[_traj(i, float(i)) for i in range(4)],  # noqa: E731
                                       engine_version=step, version=step)
    one = len(json.dumps(SampleLog(tmp_path / "x", {"T": dec}).record(
        _traj(0, 0.0), 1, rec(0)))) + 1
    # room for about 10 steps of 2 samples in a 100-step run: every ~10th step is written
    log = SampleLog(tmp_path / "s.jsonl", {"T": dec}, per_task=2, max_bytes=20 * one + 50,
                    steps=100)
    written = [s for s in range(100) if log.step(rec(s))]
    assert 5 <= len(written) <= 11 and written[0] == 0, written
    assert written[-1] >= 90  # the run's end still has samples
    assert (tmp_path / "s.jsonl").stat().st_size <= 20 * one + 50 + 200
    # dropped ones: a failure is kept before an abort, run_end ones not at all
    log = SampleLog(tmp_path / "d.jsonl", {"T": dec}, per_task=1)
    log.finished(_traj(7, None, "aborted:surplus"))
    log.finished(_traj(8, None, "env_step_failed: RuntimeError: boom"))
    log.finished(_traj(9, None, "aborted:run_end"))
    log.step(rec(0))
    rows = read_samples(tmp_path / "d.jsonl")
    assert [r["dropped"] for r in rows if r["outcome"] == "dropped"] == [
        "env_step_failed: RuntimeError: boom"]
    assert spread([_traj(i, float(i)) for i in range(5)], 1)[0].reward == 2.0
    assert [t.reward for t in spread([_traj(0, None), _traj(1, 1.0)], 2)] == [None, 1.0]


def test_dropped_trajectories_are_sampled_with_their_reason(tmp_path, test_envs, capsys):  # noqa: F811
    # Seeds = 0 mod 3 fail at reset, = 1 mod 3 hang in step (tests/control/test_pipeline.py)
    job, _ = run(tmp_path, steps=2, registry=test_envs,
                 data=single_task(env={"name": "flaky"}, max_turns=1, step_timeout_s=0.5))
    rows = read_samples(job.run_dir.path)
    dropped = [r for r in rows if r["outcome"] == "dropped"]
    assert dropped and all(sum(1 for r in dropped if r["step"] == s) <= 2 for s in (1, 2))
    assert {r["dropped"].split(":", 1)[0] for r in dropped} <= {
        "env_reset_failed", "env_step_timeout"}
    assert all(r["turns"] == [] for r in dropped if r["dropped"].startswith("env_reset"))
    assert main(["samples", str(job.run_dir.path), "--dropped"]) == 0
    out = capsys.readouterr().out
    assert "DROPPED: env_" in out


def _mass_outside(job) -> None:
    """Issue #38's symptom, made by hand in the trainer's model: rows of the output layer
    that are +-100 x each axis of the hidden space, on ids outside FrozenLake's actions,
    so that for any hidden state some outside id's logit is about 100 above the actions'
    (which are 0): the unmasked policy puts about e^-100 on the allowed tokens."""
    import torch

    model = job.pipeline.trainers[0].target.trainer.model
    allowed = set(job.pipeline.scheduler.tasks["FrozenLake"].allowed_token_ids)
    head = model.get_output_embeddings().weight
    d = head.shape[1]
    outside = [i for i in range(head.shape[0]) if i not in allowed][: 2 * d]
    with torch.no_grad():
        head[sorted(allowed)] = 0.0
        for k, row in enumerate(outside):
            head[row] = 0.0
            head[row, k % d] = 100.0 if k < d else -100.0


def test_a_policy_with_its_mass_outside_the_actions_is_warned_about_at_once(tmp_path, capsys):
    # (At the first step's metrics line: seconds into a run. No wall-clock assert: this
    # machine is shared.)
    job, _ = run(tmp_path, ["rollout.mode=sync"], steps=2, prepare=_mass_outside)
    err = capsys.readouterr().err
    first = json.loads((job.run_dir.path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["allowed_mass/FrozenLake"] < 1e-20, first
    assert first["allowed_mass_uniform/FrozenLake"] > 0.01
    # the real thresholds, at the first step's line, once
    assert err.count("warning: task FrozenLake: at step 1 the policy puts") == 1, err
    assert err.count("warning: task FrozenLake") == 1


def test_a_context_only_turn_is_printed_as_such():
    """A gateway branch's shared turn is context in one sample (trained in another):
    `rollart samples` says so instead of printing an empty action."""
    from rollart_sdk.cli.samples import render

    row = {"step": 1, "tag": "agent", "trajectory": "t", "outcome": "trained", "reward": 1.0,
           "earlier_segments": [[
               {"turn": 1, "observation": "<user>hi", "observation_ids": [1, 2, 3],
                "action": "", "action_ids": []},
               {"turn": 2, "observation": "<user>pick", "observation_ids": [4],
                "action": "a", "action_ids": [5], "versions": [0], "env_reward": 0.0}]],
           "turns": [{"turn": 1, "observation": "<user>hi", "observation_ids": [1],
                      "action": "yo", "action_ids": [6], "versions": [0], "env_reward": 0.0}]}
    out = render(row)
    assert "--- turn 1: no action: context here, trained in another sample ---" in out
    assert out.count("--- turn 1: action") == 1 and "--- turn 2: action (1 tokens" in out
