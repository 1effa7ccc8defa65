"""Dynamic sampling (``rollout.filter_zero_variance``) in real in-process runs: groups whose
rewards are all equal are dropped as ``zero_variance`` and replaced, bounded per step (a
task with no signal warns and still fills its batches), under the staleness bound, and
every launched trajectory is trained or counted as dropped with its reason."""

from __future__ import annotations

import copy
import json
from collections import Counter
from types import SimpleNamespace

import pytest
from control_configs import TWO_TASKS

from rollart_sdk.config import load_config
from rollart_sdk.errors import ConfigError
from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.job import ResumePoint, build_job, run_job
from rollart_sdk.plugins import load_plugins
from rollart_sdk.types import RewardResult

pytestmark = pytest.mark.timeout(600)


class GroupParityReward:
    """Odd groups (``g1``, ``g3``...) get rewards 0, 1, 0, 1 by member (signal); even groups
    get 0 for every member (none)."""

    def __init__(self, constant: bool = False) -> None:
        self.constant = constant

    async def score(self, request):
        _tag, group, counter = request.trajectory_id.rsplit("-", 2)
        signal = not self.constant and int(group[1:]) % 2 == 1
        reward = float(int(counter) % 2) if signal else 0.0
        return RewardResult(request.trajectory_id, reward)


@hookimpl
def rollart_register_rewards(registry):
    registry.register("parity", factory=lambda: GroupParityReward(), summary="test")
    registry.register("constant", factory=lambda: GroupParityReward(True), summary="test")


def _run(tmp_path, reward, overrides, steps=3, resume_to=None):
    data = copy.deepcopy(TWO_TASKS)
    data["tasks"] = [dict(data["tasks"][1], reward={"name": reward})]  # Arithmetic only
    data["roles"] = {"actor_gen": {"workers": 1}}
    cfg, lines = load_config(data=data, overrides=[
        f"output_dir={tmp_path}", "rollout.filter_zero_variance=true", *overrides])
    registry = load_plugins(extra={"test-rewards": SimpleNamespace(
        rollart_register_rewards=rollart_register_rewards)}).registry
    warnings: list[str] = []
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry)
    try:
        records = run_job(job, steps, progress=False)
    finally:
        job.close()
    path = job.run_dir.path
    if resume_to is not None:  # stopped after `steps`, then `rollart train --resume`
        resume = ResumePoint.prepare(cfg, path, resume_to)
        job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry,
                        resume=resume)
        try:
            records = run_job(job, resume_to, progress=False)
        finally:
            job.close()
    metrics = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((path / "summary.json").read_text())
    return SimpleNamespace(records=records, metrics=metrics, summary=summary, job=job,
                           warnings=warnings)


def _balanced(summary, run_dir=None):
    """launched = trained + every dropped reason (the run's end included), and drops.jsonl
    has a line for every trajectory counted dropped, with its reason."""
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values()), summary
    if run_dir is not None:
        lines = [json.loads(x) for x in (run_dir / "drops.jsonl").read_text().splitlines()]
        assert Counter(x["reason"] for x in lines) == Counter(summary["dropped"]), lines[:3]


def test_a_task_without_signal_is_bounded_and_said(tmp_path, capsys):
    run = _run(tmp_path, "constant", ["rollout.mode=sync", "rollout.max_filtered_per_step=2"])
    assert [m["step"] for m in run.metrics] == [1, 2, 3]
    # Each step: the batch's two groups filtered (the cap), their two replacements kept.
    assert [m["rollout/filtered_groups"] for m in run.metrics] == [2, 2, 2]
    assert [m["rollout/zero_variance_kept"] for m in run.metrics] == [2, 2, 2]
    assert run.summary["filtered_groups"] == 6 and run.summary["zero_variance_kept"] == 6
    assert run.summary["dropped"]["zero_variance"] == 6 * 4
    _balanced(run.summary, run.job.run_dir.path)
    out = capsys.readouterr()
    said = (out.out + out.err).count("gives no learning signal")
    assert said == 1, out  # once per task, not every step


def test_the_filter_counts_carry_across_a_resume(tmp_path):
    run = _run(tmp_path, "constant", ["rollout.mode=sync", "rollout.max_filtered_per_step=2",
                                      "train.steps=4"], steps=2, resume_to=4)
    assert [m["step"] for m in run.metrics] == [1, 2, 3, 4]
    assert [m["rollout/filtered_groups"] for m in run.metrics] == [2, 2, 2, 2]
    # Run totals: both sessions' (before, the resumed session counted from 0: 4 and 4).
    assert run.summary["filtered_groups"] == 8 and run.summary["zero_variance_kept"] == 8
    assert run.summary["dropped"]["zero_variance"] == 8 * 4
    _balanced(run.summary)


def test_only_groups_with_signal_reach_the_trainer_async(tmp_path):
    run = _run(tmp_path, "parity", ["rollout.mode=async", "rollout.alpha=1"], steps=3)
    for rec in run.records:
        groups: dict[str, set] = {}
        for t in rec.batch:
            groups.setdefault(t.group_id, set()).add(t.reward)
        assert groups and all(len(r) > 1 for r in groups.values()), groups
        # The staleness bound holds for the refilled batches too.
        assert all(rec.engine_version - t.start_version <= 1 for t in rec.batch)
    assert run.summary["filtered_groups"] >= 3  # about every other group
    assert run.summary["zero_variance_kept"] == 0
    assert sum(m["rollout/filtered_groups"] for m in run.metrics) <= run.summary["filtered_groups"]
    assert run.summary["dropped"]["zero_variance"] == 4 * run.summary["filtered_groups"]
    _balanced(run.summary, run.job.run_dir.path)


def test_a_group_of_one_cannot_be_filtered():
    data = copy.deepcopy(TWO_TASKS)
    with pytest.raises(ConfigError, match="groups of at least 2"):
        load_config(data=data, overrides=["rollout.filter_zero_variance=true",
                                          "rollout.group_size=1"])
