"""The control plane end to end, in-process: real torch engine, trainer, envs, rewards.

Every worker runs in this process (``build_job(in_process=True)``), so these tests check
the protocol itself - order, staleness bound, on-policy sync, aborts, failure isolation -
without Ray start-up; the Ray path is covered by tests/control/test_train_ray.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from control_configs import TWO_TASKS

from rollart_sdk.config import load_config
from rollart_sdk.job import build_job, run_job
from rollart_sdk.plugins import load_plugins


def run(tmp_path, overrides=(), steps=4, registry=None, data=None, prepare=None):
    import copy

    cfg, lines = load_config(data=copy.deepcopy(data or TWO_TASKS),
                             overrides=[f"output_dir={tmp_path}", *overrides])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry)
    if prepare is not None:
        prepare(job)
    try:
        records = run_job(job, steps, progress=False)
    finally:
        job.close()
    return job, records


def trained_tokens_versions(records):
    for rec in records:
        for traj in rec.batch:
            for turn in traj.turns:
                yield rec, traj, turn


def record_prompts(job):
    """Wrap every engine's generate: request id -> the exact ids the engine was prompted
    with and the ids it returned."""
    seen = {}
    for handle in job.pipeline.proxy.workers.values():
        engine = handle.target.engine
        inner = engine.generate

        async def generate(request, inner=inner):
            result = await inner(request)
            seen[request.request_id] = (list(request.prompt_ids), list(result.token_ids))
            return result

        engine.generate = generate
    job.prompts = seen


def test_async_protocol_order_and_alpha_bound(tmp_path):
    # A swap at every suspend point (the deferred order: tests/control/test_deferred_weights.py).
    job, records = run(tmp_path, ["rollout.defer_weight_update=false"], steps=4,
                       prepare=record_prompts)
    log = job.pipeline.log
    # Six-step order in every iteration after the first: get_batch -> suspend -> update ->
    # resume -> train_step (train_step k ran after update k was loaded; publish follows it).
    # Should training step k - 1 end while batch k still forms, the update runs inside the
    # wait (``update_in_wait:k`` first, Pipeline._next_batch), in the same order.
    protocol = [e for e in log if not e.startswith("publish:")]  # publish runs in the background
    early = set()
    for k in range(1, 4):
        i = protocol.index(f"get_batch:{k}") + 1
        if protocol[i] == f"update_in_wait:{k}":
            early.add(k)
            i += 1
        assert protocol[i : i + 4] == ["suspend", f"update:{k}", "resume", f"train_step:{k}"], log
        assert log.index(f"publish:{k}") < log.index(f"update:{k}")  # published, then loaded
    assert [r.version for r in records] == [0, 1, 2, 3]
    # The engines serve the previous version when the wait for a batch begins (the
    # record's engine_version); when the step before ended inside that wait, its update
    # ran there (its figures carried into the record).
    assert [r.engine_version for r in records] == [0, 0, 1, 2]
    assert all(records[k].weight_sync_exposed_s > 0 for k in early)
    # alpha = 1 (the paper's): batch k takes start versions >= (k - 1) - 1, so at most
    # two versions behind the trainer.
    assert all(t.start_version >= r.version - 2 for r in records for t in r.batch)
    # Per-task share of every batch (weights 1:1, groups of 4): one group each.
    for r in records:
        assert sorted(t.tag for t in r.batch) == ["Arithmetic"] * 4 + ["FrozenLake"] * 4
    # Token in / token out, checked at the engine: for every turn of every trained
    # trajectory, the ids the engine was prompted with are exactly the trained sample's
    # prefix, and the ids it returned follow that prefix, with the loss on them only.
    for rec, traj, turn in trained_tokens_versions(records):
        assert len(turn.logprobs) == len(turn.action_ids) == len(turn.versions)
        assert all(traj.start_version <= v <= rec.version for v in turn.versions)
    checked = 0
    for traj in (t for r in records for t in r.batch):
        sample = traj.to_sample()
        for k in range(len(traj.turns)):
            prompt, produced = job.prompts[f"{traj.trajectory_id}/t{k}"]
            n = len(prompt)
            assert sample.input_ids[:n] == prompt, (traj.trajectory_id, k)
            assert sample.input_ids[n : n + len(produced)] == produced
            assert set(sample.loss_mask[n : n + len(produced)]) == {1}
            assert set(sample.loss_mask[len(prompt) - len(traj.turns[k].obs_ids) : n]) <= {0}
            checked += 1
    assert checked >= 4 * 8
    # Nothing lost: every launched trajectory is trained or counted as dropped.
    p = job.pipeline
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
    # Routing by task affinity: each task only on its pool's engine.
    served = {tag: w for (tag, w) in p.proxy.served}
    assert served == {"FrozenLake": "gen-0", "Arithmetic": "gen-1"} or \
        served == {"FrozenLake": "gen-1", "Arithmetic": "gen-0"}
    pools = {h.name: h.pool for h in p.proxy.workers.values()}
    assert pools[served["FrozenLake"]] == "H800" and pools[served["Arithmetic"]] == "H20"


def test_alpha_two_allows_older_but_bounded(tmp_path):
    # Batch k takes start versions >= k - 1 - alpha and is trained at k: the paper's
    # staleness (against the engines' version when the wait began; a swap inside the
    # wait, ``update_in_wait:k``, does not move it) <= alpha, the trainer's <= alpha + 1.
    job, records = run(tmp_path, ["rollout.alpha=2"], steps=5)
    staleness = [r.engine_version - t.start_version for r in records for t in r.batch]
    assert max(staleness) <= 2
    assert all(max(r.staleness) <= 2 and min(r.staleness) >= 0 for r in records)
    assert all(r.version - t.start_version <= 3 for r in records for t in r.batch)


def test_async_alpha_zero_runs_at_most_one_version_behind_the_trainer(tmp_path):
    # alpha = 0: batch k takes start versions >= k - 1 (the batch floor) and is trained
    # at k, so every trained trajectory is at most one version behind the trainer; those
    # started after a swap inside the batch's wait (``update_in_wait:k``) none.
    job, records = run(tmp_path, ["rollout.alpha=0"], steps=4)
    assert len(records) == 4
    lag = [r.version - t.start_version for r in records[1:] for t in r.batch]
    assert set(lag) <= {0, 1}, lag
    assert all(set(r.staleness) == {0} for r in records)  # the paper's: alpha
    p = job.pipeline
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())


def test_sync_mode_is_on_policy(tmp_path):
    job, records = run(tmp_path, ["rollout.mode=sync"], steps=3)
    assert len(records) == 3 and all(r.batch for r in records)
    for rec, traj, turn in trained_tokens_versions(records):
        assert traj.start_version == rec.version == rec.engine_version
        assert set(turn.versions) == {rec.version}  # every token from the trained version
    log = job.pipeline.log
    # sync: the update of version k+1 happens before batch k+1 is collected.
    assert log.index("update:1") < log.index("get_batch:1")


def test_the_trained_policy_is_the_sampled_one(tmp_path):
    """Sync, both tasks at temperature 0.7, FrozenLake constrained to its four actions:
    the trainer's log-probs of every trained token (same weights) equal the engine's to
    float noise, and the trajectories carry the policy they were sampled from."""
    job, records = run(tmp_path, ["rollout.mode=sync", "tasks.0.sampling.temperature=0.7",
                                  "tasks.1.sampling.temperature=0.7",
                                  "trainer.options.skip_zero_advantage=false"], steps=2)
    compared = 0.0
    for rec in records:
        m = rec.train_metrics
        compared += m["mismatch_tokens"]
        if m["mismatch_tokens"]:
            assert m["mismatch_max"] < 1e-3, m
            assert abs(m["behaviour_ratio_mean"] - 1.0) < 1e-3
        assert {t.temperature for t in rec.batch} == {0.7}
        assert any(t.allowed_token_ids for t in rec.batch)
    assert compared > 0


def test_surplus_of_redundant_rollout_is_aborted(tmp_path):
    job, records = run(tmp_path, ["rollout.mode=sync", "rollout.redundancy=1.0"], steps=2)
    p = job.pipeline
    assert p.launch_per_step == {"FrozenLake": 8, "Arithmetic": 8}  # twice what a batch needs
    # 16 launched per iteration, 8 trained: the other 8 are surplus - aborted while running
    # (in the engine too) or dropped if they had already finished. Never trained later.
    surplus = p.buffer.dropped["aborted:surplus"] + p.buffer.dropped["surplus"]
    assert surplus >= 2 * 8 - p.buffer.dropped["group_incomplete:surplus"]
    assert sum(r.aborted_surplus for r in records) == p.buffer.dropped["aborted:surplus"]
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
    trained_ids = {t.trajectory_id for r in records for t in r.batch}
    assert all(t.dropped is None for r in records for t in r.batch) and len(trained_ids) == 16


FLAKY = """
import time
import gymnasium as gym
from pydantic import BaseModel, ConfigDict


class FlakyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FlakyEnv(gym.Env):
    '''Seeds = 0 mod 3 fail at reset, = 1 mod 3 hang in step, the rest answer at once.'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        self.kind = (seed or 0) % 3
        if self.kind == 0:
            raise RuntimeError("container failed to start")
        return "say something", {"answer": "1"}

    def step(self, action):
        if self.kind == 1:
            time.sleep(3)
        return "done", 1.0, True, False, {"answer": "1", "success": True}


from rollart_sdk.weights import LocalTransport


class BrokenTransport(LocalTransport):
    '''Publishes fine; every receive fails (a link that went down).'''

    def fetch(self, manifest):
        raise ConnectionError("link to the weight store is down")


class SlowEnv(gym.Env):
    '''Four turns of 0.3 s each: trajectories outlive a training step, also on a loaded CI
    machine (at 0.15 s a training step there once outlasted the episodes).'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return "go", {}

    def step(self, action):
        time.sleep(0.3)
        self.t += 1
        done = self.t >= 4
        return "go on", float(done), done, False, {"success": done}


class SlowVarEnv(gym.Env):
    '''Episodes of 2, 4 or 6 turns (by seed) of 0.15 s each: long ones outlive several
    training steps, short ones do not. Reward 1 for the action "a" at the last turn.'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        self.t, self.n = 0, 2 + 2 * ((seed or 0) % 3)
        return "go", {}

    def step(self, action):
        time.sleep(0.15)
        self.t += 1
        done = self.t >= self.n
        return "go on", float(done and action.strip().startswith("a")), done, False, {}


class DictObsEnv(gym.Env):
    '''Two turns; on odd seeds the second observation is a dict (an env bug).'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        self.t, self.bad = 0, (seed or 0) % 2 == 1
        return "go", {}

    def step(self, action):
        self.t += 1
        if self.t == 1:
            return ({"pos": 3} if self.bad else "again"), 0.0, False, False, {}
        return "done", 1.0, True, False, {}


class CoinEnv(gym.Env):
    '''Seeds = 0 mod 3 succeed (reward 1) after three quick turns; the others fail
    (reward 0) after one.'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        self.t, self.win = 0, (seed or 0) % 3 == 0
        return "go", {}

    def step(self, action):
        self.t += 1
        done = self.t >= (3 if self.win else 1)
        win = done and self.win
        return "go on", float(win), done, False, {"success": win} if done else {}


class SlowResetEnv(gym.Env):
    '''A reset of 0.4 s (a container starting), then one quick turn; reward 1 for "a".'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        time.sleep(0.4)
        return "go", {}

    def step(self, action):
        return "done", float(action.strip().startswith("a")), True, False, {}


class NanEnv(gym.Env):
    '''One turn whose reward is NaN (a broken reward computation in an env).'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        return "go", {}

    def step(self, action):
        return "done", float("nan"), True, False, {}
"""


@pytest.fixture
def test_envs(tmp_path, monkeypatch):
    """A plugin set with the installed plugins plus the test envs ``flaky`` and ``slow``."""
    import sys

    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    (mod_dir / "rollart_test_envs.py").write_text(FLAKY)
    monkeypatch.syspath_prepend(str(mod_dir))
    from rollart_sdk import hookimpl

    def rollart_register_envs(registry):
        for name, cls in (("flaky", "FlakyEnv"), ("slow", "SlowEnv"), ("slowvar", "SlowVarEnv"),
                          ("nan", "NanEnv"), ("dictobs", "DictObsEnv"), ("coin", "CoinEnv"),
                          ("slowreset", "SlowResetEnv")):
            registry.register(name, factory=f"rollart_test_envs:{cls}",
                              options="rollart_test_envs:FlakyOptions")

    def rollart_register_transports(registry):
        registry.register("broken", factory="rollart_test_envs:BrokenTransport",
                          options="rollart_sdk.weights.local:LocalTransportOptions")

    yield load_plugins(strict=True, extra={"test-envs": SimpleNamespace(
        rollart_register_envs=hookimpl(rollart_register_envs),
        rollart_register_transports=hookimpl(rollart_register_transports))}).registry
    sys.modules.pop("rollart_test_envs", None)


def single_task(**task):
    data = dict(TWO_TASKS)
    data["tasks"] = [{"tag": "T", "reward": {"name": "rule", "options": {"mode": "env_return"}},
                      "system_prompt": None, "sampling": {"max_new_tokens": 2}, **task}]
    return data


def test_finished_episodes_outcomes_are_the_batchs_in_sync_mode(tmp_path, test_envs):
    """reward_finished/<tag> and success_finished/<tag>: over every episode that ended
    since the step before, trained or not. In sync mode every launched episode of the
    step is in its batch, so they are the batch's reward/<tag> and success/<tag>, step
    by step (the counts are per-step differences of run totals)."""
    import json

    data = single_task(env={"name": "coin"}, max_turns=3)
    data["rollout"] = {"batch_size": 16, "group_size": 4, "mode": "sync", "alpha": 1}
    job, _ = run(tmp_path, [], steps=3, registry=test_envs, data=data)
    lines = [json.loads(x) for x in (job.run_dir.path / "metrics.jsonl").read_text()
             .splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert line["reward_finished/T"] == pytest.approx(line["reward/T"])
        assert line["success_finished/T"] == pytest.approx(line["success/T"])
    values = {x["success_finished/T"] for x in lines}
    assert values - {0.0, 1.0}, values  # some steps had winning and losing groups


def test_long_episodes_are_trained_across_updates(tmp_path, test_envs):
    # Episodes of 2-6 slow turns: the long ones live through several training steps. With
    # alpha = 2 admission control starts the batch after next before an update, so those
    # episodes continue across weight updates (tokens from two versions) and are trained,
    # the batches are not biased toward short episodes, and no trained trajectory exceeds
    # the bound. (At alpha 1 admission starts batch t + 1 only once the engines serve t,
    # and it is complete before the next update: nothing spans one in steady state.)
    from rollart_sdk.control.metrics import run_rollout_summary

    job, records = run(tmp_path, ["rollout.max_envs=32", "rollout.alpha=2"], steps=8,
                       registry=test_envs,
                       data=single_task(env={"name": "slowvar"}, max_turns=6))
    p = job.pipeline
    s = run_rollout_summary(p)
    assert s["spanning_update"] > 0, s
    # 0.89-1.0 over 9 runs, two at a time on 2 cores (which episodes the run drops at
    # its end depends on timing); batches of the episodes that end first (2 and 4 of
    # the 2 / 4 / 6 turns) would give 0.75, of the 2-turn ones 0.5.
    assert s["length_bias"]["T"] >= 0.85, s
    # The bound: batch s takes start versions >= s - 1 - alpha (Pipeline's batch floor).
    assert all(t.start_version >= r.step - 3 for r in records for t in r.batch)
    assert max(len(t.turns) for r in records for t in r.batch) == 6
    # Trained episodes lived through batch formations (about three iterations when the
    # machine is idle; fewer when training slows under load): count them.
    formed = [r.formed_at for r in records]
    lived = max(sum(1 for f in formed if t.timings[0][1] < f < t.timings[-1][2])
                for r in records for t in r.batch)
    assert lived >= 1
    # A trajectory that spanned an update was generated by both versions, token by token.
    spans = [t for r in records for t in r.batch if len(t.versions) > 1]
    # (Which ones span an update depends on timing: a short one can too, if the update
    # lands inside its last generate. What holds: tokens in order of version, two versions.)
    assert spans
    for t in spans:
        flat = [v for turn in t.turns for v in turn.versions]
        # Tokens go at most up to the version of the step that trains them (the engines
        # follow each step at once): s - start <= 1 + alpha.
        assert flat == sorted(flat) and 1 <= flat[-1] - flat[0] <= 3, flat
    # Admission control, not abort-after-the-fact: few are lost while the run goes on.
    assert s["waste"] <= 0.25, s
    assert sum(r.aborted_stale for r in records) == p.buffer.dropped["aborted:stale"]
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
    # O(alpha * E): never more than alpha + 1 batches launched and untrained.
    assert p.buffer.max_ready_trajectories <= 3 * 8


def test_batched_interaction_steps_in_lockstep(tmp_path, test_envs):
    # interaction: batched (the paper's plain Sync): no environment of an iteration starts
    # generating turn t before every environment of that iteration finished turn t - 1.
    job, records = run(tmp_path, ["rollout.mode=sync", "rollout.interaction=batched"], steps=2,
                       registry=test_envs, data=single_task(env={"name": "slowvar"}, max_turns=6))
    waves = {}
    for r in records:
        for t in r.batch:
            waves.setdefault(t.start_version, []).append(t)
    checked = 0
    for members in waves.values():
        gens = [[t0 for span, t0, _ in m.timings if span == "generate"] for m in members]
        steps = [[t1 for span, _, t1 in m.timings if span == "env_step"] for m in members]
        for turn in range(1, max(len(g) for g in gens)):
            first_start = min(g[turn] for g in gens if len(g) > turn)
            last_end = max(s[turn - 1] for s in steps if len(s) >= turn)
            assert first_start >= last_end, (turn, first_start, last_end)
            checked += 1
    assert checked >= 4
    assert {len(t.turns) for r in records for t in r.batch} > {2}  # lengths differ


def test_failing_env_does_not_stall_others(tmp_path, test_envs):
    t0 = time.time()
    job, records = run(tmp_path, steps=2, registry=test_envs,
                       data=single_task(env={"name": "flaky"}, max_turns=1, step_timeout_s=0.5))
    assert len(records) == 2
    dropped = job.pipeline.buffer.dropped
    assert dropped["env_reset_failed"] > 0 and dropped["env_step_timeout"] > 0, dict(dropped)
    assert all(t.reward == 1.0 for r in records for t in r.batch)
    assert time.time() - t0 < 120


def test_a_non_text_observation_drops_its_episode_not_the_run(tmp_path, test_envs):
    job, records = run(tmp_path, steps=2, registry=test_envs,
                       data=single_task(env={"name": "dictobs"}, max_turns=3))
    assert len(records) == 2 and all(t.reward == 1.0 for r in records for t in r.batch)
    # each bad episode is dropped with the reason, the run goes on with the others
    assert job.pipeline.buffer.dropped["env_step_failed"] > 0, dict(job.pipeline.buffer.dropped)
    drops = (job.run_dir.path / "drops.jsonl").read_text()
    assert "env step() returned an observation of type dict" in drops


def test_failed_weight_sync_stops_with_the_reason_and_a_final_checkpoint(tmp_path, test_envs):
    import json

    from rollart_sdk.weights import WeightSyncError

    with pytest.raises(WeightSyncError, match="link to the weight store is down"):
        run(tmp_path, ["transport.name=broken"], steps=3, registry=test_envs)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("t-")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "WeightSyncError" in summary["error"] and summary["steps"] >= 1
    newest = summary["newest_checkpoint"]  # the final save
    assert newest and (run_dir / "checkpoints" / newest.rsplit("/", 1)[1] / "trainer_state.json").exists()


def test_batch_too_small_for_tasks_is_a_clear_error(tmp_path):
    from rollart_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match="raise batch_size to at least 8"):
        run(tmp_path, ["rollout.batch_size=4"], steps=1)


def test_a_nan_reward_is_dropped_with_its_reason_not_trained(tmp_path, test_envs):
    # Reward mode env_return passes the env's NaN on: every trajectory is dropped as
    # reward_invalid (not trained: a NaN advantage would void the whole step) and the
    # watchdog stops the run naming it.
    from rollart_sdk.control.watchdog import RunFailure

    with pytest.raises(RunFailure, match="reward_invalid") as err:
        run(tmp_path, ["rollout.mode=sync"], steps=2, registry=test_envs,
            data=single_task(env={"name": "nan"}, max_turns=1))
    assert "returned reward nan (not finite)" in str(err.value)
    assert "reward backend 'rule' of task 'T'" in str(err.value), str(err.value)


def test_admission_runs_the_rollout_at_most_alpha_batches_ahead_of_the_trainer():
    """AReaL's rule, N <= (i + eta + 1) * B: a trajectory started now must land in a batch
    trained within max(alpha, 1) versions of the weights that sample it. The engines serve
    version 5, batch 5 is training (6 batches of 64 handed out): the rollout may start
    batch 6 (trained at version 6, one after the weights that sample it), not batch 7 too
    (two after: the old rule, ``(engine + alpha + 2) * share``, let a rollout faster than
    training fill it, and every batch was then trained two versions after it was
    sampled)."""
    from rollart_sdk.control.buffer import SampleBuffer
    from rollart_sdk.control.scheduler import RolloutScheduler
    from rollart_sdk.control.versions import PolicyVersions

    versions = PolicyVersions(engine=5, trainer=5)

    def room(alpha: int) -> int | None:
        s = RolloutScheduler({}, None, None, {}, None, SampleBuffer(8),  # type: ignore[arg-type]
                             version=versions.serving, group_size=8, max_running=64,
                             alpha=alpha, batch_quota={"T": 64},
                             admission_version=versions.admission_base)
        s.launched_by_tag["T"] = 6 * 64
        return s.admission_room("T")

    assert room(1) == 64
    assert room(2) == 2 * 64
    assert room(0) == 64  # one_off-like: one batch still overlaps training
    # Training ended (version 6 published), the engines not swapped yet: nothing more
    # starts on version 5 (batch 7 would be trained two versions after it); the update
    # runs as soon as the step ends, also while a batch forms (Pipeline._next_batch), and
    # then batch 7 starts on version 6.
    versions.trainer = 6
    assert room(1) == 64
    versions.engine = 6
    assert room(1) == 2 * 64
    # A deferred update holds the engines on 5 through training step 6: batch 7 must
    # still start (get_batch would wait for it for ever); deferring costs that version.
    versions.engine, versions.held_back = 5, True
    assert room(1) == 2 * 64
    # ... and training step 6 ends before that update is swapped in (trainer 7): batch 8
    # (floor 6) could not take what version 5 samples, so nothing more starts.
    versions.trainer = 7
    assert room(1) == 2 * 64
    assert room(2) == 3 * 64  # alpha 2: batch 8 takes version 5 (floor 5)


def test_async_swaps_in_a_finished_step_while_the_next_batch_forms(tmp_path, test_envs):
    """Slow env turns (the rollout slower than training): a training step ends while the
    next batch still forms, and its weights go to the engines then, before that batch is
    trained, not after it. Deferral off: a deferred update keeps the engines a version
    behind on purpose.

    What the swap bought here (2026-12-06, 3 runs each way): 16 trajectories in flight,
    batches of 8, episodes of equal length. With the swap the two cohorts stayed apart
    and every other batch was already whole when the step before ended; without it every
    step waited a whole episode (1.3 s). The staleness stays within the floor's bound
    (alpha 1: trained at most two versions after it started); a cohort launched before a
    swap is trained two after, so the bound, not one, is what holds (this test asserted
    one, and failed on most runs)."""
    job, records = run(tmp_path, ["rollout.max_envs=16", "rollout.defer_weight_update=false"],
                       steps=6, registry=test_envs,
                       data=single_task(env={"name": "slow"}, max_turns=4))
    log = job.pipeline.log
    swapped = [int(e.split(":")[1]) for e in log if e.startswith("update_in_wait:")]
    assert swapped, log
    for s in swapped:  # in the wait for batch s, before it was taken and trained
        assert log.index(f"get_batch:{s}") < log.index(f"update:{s}") < log.index(
            f"train_step:{s}"), log
    lag = [rec.step - t.start_version for rec in records for t in rec.batch]
    assert max(lag) <= 2, sorted(set(lag))
    # Trajectories launched after a swap inside wait s sampled version s from their first
    # token: some of them are in the batches after it.
    started = {t.start_version for rec in records for t in rec.batch}
    assert set(swapped) & started, (swapped, sorted(started))
    early = [r for r in records if f"update_in_wait:{r.step}" in log]
    assert all(r.weight_sync_exposed_s > 0 for r in early)  # its figures were carried over


def test_the_run_sets_the_collectors_young_threshold_from_the_trajectories_in_flight(
        tmp_path, monkeypatch):
    """control/collector.py: the young threshold is set at the start from the hint
    (``rollout.max_envs``) and after each step from max(in flight, hint); the user's
    threshold is back after the run."""
    import gc

    from rollart_sdk.control.collector import YOUNG_PER_TRAJECTORY, DriverCollector

    before = gc.get_threshold()
    seen: list[tuple[int, int]] = []
    fit = DriverCollector.fit

    def spy(self, in_flight):
        out = fit(self, in_flight)
        seen.append((in_flight, gc.get_threshold()[0]))
        return out

    monkeypatch.setattr(DriverCollector, "fit", spy)
    _, records = run(tmp_path, ["rollout.max_envs=300"], steps=2)
    assert len(records) == 2 and len(seen) == 1 + 2, seen
    assert seen[0] == (300, YOUNG_PER_TRAJECTORY * 300)  # the hint, before any step
    for (n, threshold), rec in zip(seen[1:], records, strict=True):
        assert n == max(rec.in_flight, 300)
        assert threshold == YOUNG_PER_TRAJECTORY * n
    assert gc.get_threshold() == before


@pytest.mark.parametrize("stream", ["true", "auto", "false"])
def test_sync_sends_each_group_to_the_trainer_as_it_completes(tmp_path, test_envs, stream):
    """train.stream_groups: in sync mode the groups that complete while the batch is short
    go to the trainer's accumulate (forward and backward), the one that makes it whole to
    train_step, which steps once for all of them. Episodes of 2, 4 or 6 slow turns by
    seed: the three groups of a batch complete at different times, a tail far longer
    than the tiny model's training. true streams every step; auto every step after the
    first (which has no figures to decide by: stream_pays); false (the default) sends the
    whole batch in one call. Every trajectory is trained once."""
    data = single_task(env={"name": "slowvar"}, max_turns=6)
    data["rollout"] = {"batch_size": 12, "group_size": 4, "mode": "sync", "alpha": 1}
    job, records = run(tmp_path, [f"train.stream_groups={stream}"], steps=3,
                       registry=test_envs, data=data)
    p = job.pipeline
    assert ("stream_groups:" + {"true": "True", "auto": "auto"}.get(stream, "")
            in p.log) == (stream != "false")
    parts = [r.train_metrics["parts"] for r in records]
    assert len(records) == 3 and all(len(r.batch) == 12 for r in records)
    if stream == "false":
        assert parts == [1.0, 1.0, 1.0]
        assert all(r.batch_spread_s is None for r in records)
    else:
        first = 1 if stream == "auto" else 0
        assert parts[:first] == [1.0] * first and max(parts[first:]) >= 2, parts
        assert all(r.train_metrics.get("time/train_accumulate", 0) > 0
                   for r in records if r.train_metrics["parts"] > 1)
        assert all(r.batch_spread_s is not None and r.batch_spread_s > 0 for r in records)
    assert [r.train_metrics["sequences"] for r in records] == [12.0] * 3
    assert p.trainer_version == 3
    for rec, _traj, turn in trained_tokens_versions(records):
        assert set(turn.versions) == {rec.version}  # on-policy, as without streaming
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
    assert p.buffer.trained == 36


def test_a_step_streams_when_the_last_tail_could_hide_its_training():
    from rollart_sdk.control.stream_groups import STREAM_SPREAD_FACTOR, stream_pays

    assert STREAM_SPREAD_FACTOR == 2.0
    assert stream_pays(0.83, 0.22)  # a long-tailed env latency: the tail 3.9x the training
    assert not stream_pays(0.027, 0.10)  # no env latency: every group ends at once
    assert stream_pays(0.2, 0.1) and not stream_pays(0.19, 0.1)  # the factor is the bound


def test_stream_groups_true_where_it_cannot_be_is_an_error_that_says_why(tmp_path):
    import copy

    from rollart_sdk.control.watchdog import RunFailure
    from rollart_sdk.errors import ConfigError

    for want in ("true", "auto"):
        with pytest.raises(ConfigError, match=f"train.stream_groups {want} needs rollout.mode "
                                              "sync .* set train.stream_groups to false"):
            load_config(data=copy.deepcopy(TWO_TASKS), overrides=[f"train.stream_groups={want}"])
    with pytest.raises(RunFailure, match="updates_per_batch 1\\): set train.stream_groups "
                                         "to false"):
        run(tmp_path, ["rollout.mode=sync", "train.stream_groups=auto",
                       "trainer.options.updates_per_batch=2"], steps=1)
    cfg, _ = load_config(data=copy.deepcopy(TWO_TASKS))
    assert cfg.train.stream_groups is False  # the default: one call, bit-reproducible


@pytest.mark.parametrize("ahead", [True, False])
def test_sync_resets_the_next_steps_envs_while_the_trainer_trains(tmp_path, test_envs, ahead):
    """``rollout.reset_ahead`` (sync): step k+1's trajectories are launched when step k's
    training starts; their environments reset during it (0.4 s each here), and their first
    generation waits until the engines serve version k+1, so every trained token is still
    the trained version's. Off: nothing resets before the update."""
    import json

    job, records = run(tmp_path, ["rollout.mode=sync", "rollout.batch_size=4",
                                  f"rollout.reset_ahead={str(ahead).lower()}",
                                  "tasks.0.env_host=thread"],
                       steps=3, registry=test_envs,
                       data=single_task(env={"name": "slowreset"}, max_turns=1))
    assert [r.step for r in records] == [0, 1, 2]
    events = [json.loads(x) for x in (job.run_dir.path / "events.jsonl").read_text().splitlines()]
    train_end = {e["step"]: e["t1"] for e in events if e.get("span") == "train"}
    swapped = {e["version"]: e["t1"] for e in events if e.get("span") == "weight_sync"}
    for rec in records:
        for traj in rec.batch:
            assert traj.start_version == rec.version == rec.engine_version
            assert {v for turn in traj.turns for v in turn.versions} == {rec.version}
            if rec.step == 0:
                continue
            reset = next(t0 for span, t0, _ in traj.timings if span == "env_reset")
            first_gen = next(t0 for span, t0, _ in traj.timings if span == "generate")
            assert first_gen >= swapped[rec.version]  # sampled on the trained version
            if ahead:  # reset while the step before trained
                assert reset < train_end[rec.step - 1]
            else:
                assert reset >= train_end[rec.step - 1]
    log = job.pipeline.log
    assert [x for x in log if x.startswith("reset_ahead")] == (
        ["reset_ahead:1", "reset_ahead:2"] if ahead else [])
    p = job.pipeline
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())


def test_reset_ahead_waits_for_a_step_whose_checkpoint_or_evaluation_is_due(tmp_path, test_envs):
    """No trajectory is in flight at a sync step's checkpoint or evaluation: the step
    before one launches its successor after the update, as without reset_ahead."""
    job, records = run(tmp_path, ["rollout.mode=sync", "rollout.batch_size=4",
                                  "train.checkpoint_every=2", "tasks.0.env_host=thread"],
                       steps=4, registry=test_envs,
                       data=single_task(env={"name": "slowreset"}, max_turns=1))
    assert len(records) == 4
    log = job.pipeline.log
    assert [x for x in log if x.startswith("reset_ahead")] == ["reset_ahead:1", "reset_ahead:3"]


@pytest.mark.timeout(120)  # a hang guard: held trajectories the stop does not release wait 600 s
def test_trajectories_held_for_their_weights_end_at_once_when_the_run_stops(
        tmp_path, test_envs, monkeypatch):
    """A run that fails at the update after step 0 (its weight link is down) while step 1's
    trajectories, reset ahead, wait for the new weights: the stop's abort lets them go,
    each counted as aborted by the run's end. The stop's grace is raised to 600 s here, so
    trajectories that the abort did not release would hang the test."""
    import json

    from rollart_sdk.control.scheduler import RolloutScheduler
    from rollart_sdk.weights import WeightSyncError

    stop = RolloutScheduler.stop
    monkeypatch.setattr(RolloutScheduler, "stop",
                        lambda self, reason="shutdown", **kw: stop(self, reason, grace=600.0))

    def slow_training(job):  # step 0 trains for 1.5 s: the 0.4 s resets end before it
        worker = job.pipeline.trainers[0].target
        inner = worker.trainer.train_step

        def train_step(samples, inner=inner):
            time.sleep(1.5)
            return inner(samples)

        worker.trainer.train_step = train_step

    with pytest.raises(WeightSyncError):
        run(tmp_path, ["rollout.mode=sync", "rollout.batch_size=4", "transport.name=broken",
                       "tasks.0.env_host=thread"], steps=3, registry=test_envs,
            data=single_task(env={"name": "slowreset"}, max_turns=1), prepare=slow_training)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("t-")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["launched"] == 8 and summary["trained"] == 4
    assert summary["dropped"] == {"aborted:run_end": 4}
