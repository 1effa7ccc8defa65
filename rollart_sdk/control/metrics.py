"""Metrics of a run: one step's figures (``metrics.jsonl``, the progress display), the
rollout summary (waste, length bias, spanning) and the learning summary of a finished run
(``summary.json``, docs/quickstart.md)."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from rollart_sdk.control.records import staleness as paper_staleness

if TYPE_CHECKING:
    from rollart_sdk.control.buffer import SampleBuffer
    from rollart_sdk.control.pipeline import Pipeline, StepRecord
    from rollart_sdk.types import Trajectory


def step_metrics(rec: StepRecord, prev: StepRecord | None, buffer: SampleBuffer,
                 wall: float) -> dict[str, Any]:
    """One line of metrics.jsonl. ``step`` counts steps done (1 for the first), as the
    console does. Run totals (``rollout/waste``...) are as of the batch's formation."""
    by_tag: dict[str, list[Trajectory]] = {}
    for t in rec.batch:
        by_tag.setdefault(t.tag, []).append(t)
    # The paper's staleness: engine version when the batch's wait began - start version
    # (records.staleness); the trainer's: version the batch is trained at - start version
    # (one more in async).
    staleness = [paper_staleness(rec, t) for t in rec.batch]
    trainer_staleness = [rec.version - t.start_version for t in rec.batch]
    decided = rec.trained_total + rec.dropped_during_run
    tokens = rec.tokens_trained + rec.tokens_dropped
    m: dict[str, Any] = {
        "step": rec.step + 1,
        "wall_time": round(wall, 3),
        "version": rec.version,
        "engine_version": rec.engine_version,
        "staleness/max": max(staleness),
        "staleness/mean": sum(staleness) / len(staleness),
        "staleness/hist": dict(sorted(Counter(staleness).items())),
        "staleness/trainer_max": max(trainer_staleness),
        "trajectories/trained": rec.trained_total,
        "trajectories/dropped": rec.dropped,
        "trajectories/aborted_stale": rec.aborted_stale,
        "trajectories/aborted_surplus": rec.aborted_surplus,
        "rollout/launched": rec.launched,
        "rollout/launched_step": rec.launched - (prev.launched if prev else 0),
        # Share of the trajectories decided so far (trained or dropped) that were thrown
        # away, and the same in generated tokens.
        "rollout/waste": round(rec.dropped_during_run / decided, 4) if decided else 0.0,
        "rollout/waste_tokens": round(rec.tokens_dropped / tokens, 4) if tokens else 0.0,
        # Trained trajectories whose tokens come from more than one policy version.
        "rollout/spanning_update": sum(1 for t in rec.batch if len(t.versions) > 1),
        "buffer/max_ready": buffer.max_ready_trajectories,
        "time/get_batch_wait": round(rec.get_batch_wait_s, 4),
        "time/train": round(rec.train_s, 4),
        **({"time/batch_spread": round(rec.batch_spread_s, 4)}
           if rec.batch_spread_s is not None else {}),
        "time/weight_sync": round(rec.weight_sync_exposed_s, 4),
        "time/weight_transfer": round(rec.weight_transfer_s, 4),
        "weight_sync/exposed_s": round(rec.weight_sync_exposed_s, 4),
        "weight_sync/transfer_s": round(rec.weight_transfer_s, 4),
        "weight_sync/recompute_s": round(rec.weight_recompute_s, 4),
        "weight_sync/nbytes": rec.weight_sync_nbytes,
        "weight_sync/recomputed_requests": rec.recomputed,
        # Engines whose own workers received the version (the collective path).
        "weight_sync/direct_engines": rec.weight_sync_direct,
        # The bound forced a wait for the staged version (part of exposed_s).
        "weight_sync/wait_s": round(rec.weight_sync_wait_s, 4),
        # 1: at this step's suspend point the staged version had not arrived everywhere,
        # and the engines kept generating on theirs (the swap comes at a later one).
        "weight_sync/deferred": int(rec.weight_deferred is not None),
        "weight_sync/lag": rec.version - rec.engine_version,
    }
    if rec.filtered_groups is not None:
        # Dynamic sampling: groups filtered since the previous batch, and those kept past
        # the cap (rollout.max_filtered_per_step); run totals in summary.json.
        m["rollout/filtered_groups"] = rec.filtered_groups
        m["rollout/zero_variance_kept"] = sum(map(len, rec.zero_variance_kept.values()))
    if rec.weight_sync_failed is not None:
        m["weight_sync/failed_version"] = rec.weight_sync_failed
    if rec.weight_sync_exposed_s > 0 and rec.weight_sync_baseline_s:
        # The paper's "hides 67-78 % of the pull cost": 1 - exposed / the same update with
        # nothing overlapping (pull + swap + recompute, measured once per run).
        m["weight_sync/baseline_s"] = round(rec.weight_sync_baseline_s, 4)
        m["weight_sync/hidden_fraction"] = round(
            max(0.0, 1.0 - rec.weight_sync_exposed_s / rec.weight_sync_baseline_s), 4)
    for reason, n in sorted(buffer.dropped.items()):
        m[f"dropped/{reason}"] = n
    for tag, trajs in sorted(by_tag.items()):
        _task_metrics(m, tag, trajs, rec, prev)
    for k, v in rec.train_metrics.items():
        m[k if "/" in k else f"train/{k}"] = v
    return m


def _task_metrics(m: dict[str, Any], tag: str, trajs: list[Trajectory], rec: StepRecord,
                  prev: StepRecord | None) -> None:
    """The per-task entries of a step's metrics line (reward, success, turns...)."""
    m[f"reward/{tag}"] = sum(t.reward or 0.0 for t in trajs) / len(trajs)
    succ = [t.info.get("success") for t in trajs if "success" in t.info]
    if succ:
        m[f"success/{tag}"] = sum(1.0 for s in succ if s) / len(succ)
    m[f"turns/{tag}"] = sum(len(t.all_turns) for t in trajs) / len(trajs)
    # Share of the turns whose env judged the action invalid (envs that say so).
    judged = [turn.invalid_action for t in trajs for turn in t.all_turns
              if turn.invalid_action is not None]
    if judged:
        m[f"invalid_action/{tag}"] = sum(1 for j in judged if j) / len(judged)
    m[f"count/{tag}"] = len(trajs)
    # Agent tasks (docs/gateway.md): segments per episode (1: the agent only appended
    # to its history; more: it, or the chat template, rewrote it: each a sample).
    segs = [t.info["agent_segments"] for t in trajs if "agent_segments" in t.info]
    if segs:
        m[f"agent/segments/{tag}"] = sum(segs) / len(segs)
        m[f"agent/requests/{tag}"] = sum(t.info.get("agent_requests", 0)
                                        for t in trajs) / len(trajs)
        # Choices of n > 1 requests that the agent did not follow (not trained).
        m[f"agent/branches_untrained/{tag}"] = sum(
            t.info.get("agent_branches_untrained", 0) for t in trajs) / len(trajs)
        # Replies parsed as tool calls, and prompt tokens the gateway wrote to force one
        # (tool_choice "required" / a named function; never trained), per episode.
        for key, name in (("gateway_tool_call_replies", "tool_calls"),
                          ("gateway_forced_prefix_tokens", "forced_prefix_tokens")):
            m[f"agent/{name}/{tag}"] = sum(t.info.get(key, 0) for t in trajs) / len(trajs)
    # Turns of every episode that ended since the previous batch, trained or not:
    # turns/<tag> over it is the length bias of what gets trained (1: none).
    n, turns = rec.finished_turns.get(tag, (0, 0))
    if prev is not None:
        n0, t0 = prev.finished_turns.get(tag, (0, 0))
        n, turns = n - n0, turns - t0
    if n:
        m[f"turns_finished/{tag}"] = turns / n
        m[f"length_bias/{tag}"] = round(m[f"turns/{tag}"] / (turns / n), 4)
    # Reward and success of the same episodes: what the policy does, where the batch's
    # reward/<tag> and success/<tag> are what it trains on (in async mode the groups that
    # completed first, more of the short episodes).
    o = rec.finished_outcomes.get(tag, (0, 0.0, 0, 0))
    if prev is not None:
        p = prev.finished_outcomes.get(tag, (0, 0.0, 0, 0))
        o = (o[0] - p[0], o[1] - p[1], o[2] - p[2], o[3] - p[3])
    if o[0]:
        m[f"reward_finished/{tag}"] = round(o[1] / o[0], 6)
    if o[2]:
        m[f"success_finished/{tag}"] = round(o[3] / o[2], 6)


def run_rollout_summary(pipeline: Pipeline) -> dict[str, Any]:
    """Waste, length bias, spanning and staleness over the whole run (summary.json, the
    benches): every step's record (their batches are freed after ``KEEP_BATCHES`` steps,
    so the figures come from what each record kept), the sessions before a resume
    included (``pipeline.carried``)."""
    b = pipeline.buffer
    run_end = sum(n for k, n in b.dropped.items() if k.endswith("run_end"))
    during = sum(b.dropped.values()) - run_end
    wasted = b.tokens_dropped - b.tokens_run_end  # the stop's are not waste, as above
    carry = summary_carry(pipeline)
    out: dict[str, Any] = {
        "launched": pipeline.scheduler.launched,
        "trained": b.trained,
        "dropped_during_run": during,
        "waste": during / (b.trained + during) if b.trained + during else 0.0,
        "waste_tokens": (wasted / (wasted + b.tokens_trained)
                         if wasted + b.tokens_trained else 0.0),
        "spanning_update": carry["spanning_update"],
        "staleness_hist": {int(k): v for k, v in sorted(
            carry["staleness_hist"].items(), key=lambda kv: int(kv[0]))},
        "length_bias": {},
    }
    for tag, (n, turns) in sorted(b.finished_turns.items()):
        mine_n, mine_turns = carry["trained_turns"].get(tag, (0, 0))
        if n and mine_n and turns:
            out["length_bias"][tag] = (mine_turns / mine_n) / (turns / n)
    return out


def summary_carry(pipeline: Pipeline, upto: int | None = None) -> dict[str, Any]:
    """The run summary's raw figures: the carried ones of the sessions before a resume
    plus this session's records (those of steps ``< upto`` when given). JSON-ready: what a
    checkpoint's ``run_state.json`` keeps (``summary``) for the next session.
    ``finished_stats`` are the per-step figures of every episode that ended since the step
    before (:func:`finished_stats`); ``task_stats`` the batch's."""
    c = pipeline.carried
    stats = list(c.get("task_stats", []))
    # A checkpoint written before the finished figures existed carries none: the steps
    # before it then have no figures (None), so a step's place in the list is its own.
    fin = list(c.get("finished_stats", [None] * len(stats)))
    spanning = int(c.get("spanning_update", 0))
    hist: Counter[str] = Counter({str(k): int(v) for k, v in c.get("staleness_hist", {}).items()})
    turns = {tag: [int(n), int(t)] for tag, (n, t) in c.get("trained_turns", {}).items()}
    prev = getattr(pipeline, "session_start", None)
    for r in pipeline.records:
        if upto is not None and r.step >= upto:
            continue
        stats.append(r.task_stats)
        fin.append(finished_stats(r, prev))
        prev = r
        spanning += r.spanning
        hist.update({str(k): v for k, v in r.staleness.items()})
        for tag, (n, t) in r.trained_turns.items():
            acc = turns.setdefault(tag, [0, 0])
            acc[0] += n
            acc[1] += t
    return {"task_stats": stats, "finished_stats": fin, "spanning_update": spanning,
            "staleness_hist": dict(hist), "trained_turns": turns}


def finished_stats(rec: StepRecord, prev: StepRecord | None
                   ) -> dict[str, dict[str, float | None]]:
    """Per task, in :func:`task_stats`'s shape: mean reward and success rate of every
    episode that ended between ``prev``'s batch and ``rec``'s (``reward_finished/<tag>``,
    ``success_finished/<tag>``), trained or not."""
    out: dict[str, dict[str, float | None]] = {}
    for tag, o in rec.finished_outcomes.items():
        p = prev.finished_outcomes.get(tag, (0, 0.0, 0, 0)) if prev is not None else (0, 0.0, 0, 0)
        n, total, judged, wins = (o[0] - p[0], o[1] - p[1], o[2] - p[2], o[3] - p[3])
        if n or judged:
            out[tag] = {"reward": total / n if n else None,
                        "success": wins / judged if judged else None,
                        "n": float(n), "n_success": float(judged)}
    return out


def learning_summary(pipeline: Pipeline) -> dict[str, dict[str, Any]]:
    """Per task: reward (and success rate) of the first step, and the first tenth of the
    steps against the last tenth, each with its spread (the standard deviation of the
    steps' values), and whether the change is beyond the noise: ``<key>_change`` is
    ``up`` or ``down`` when the two tenths differ by more than twice the standard error
    of the difference (from the steps' spread; with one step per tenth, from the binomial
    spread of a success rate), else ``no clear change``; None when it cannot be told
    (one step per tenth and no success rate, or fewer than two steps). The figures
    docs/quickstart.md reports.

    ``over`` says what the figures average: ``finished episodes`` (every episode that
    ended in the step, trained or not: what the policy does; in async mode a batch is the
    groups that completed first, more of the short episodes; a step in which none of the
    task's ended has no figure), else ``batches`` (the trained episodes): for a run
    resumed from a checkpoint older than the finished figures, records without them, or
    a task none of whose episodes ended in the first or the last tenth. Read from each
    record's figures, which outlive the trajectories the pipeline frees, the steps of the
    sessions before a resume included."""
    carry = summary_carry(pipeline)
    batches = carry["task_stats"]
    if not batches:
        return {}
    k = max(1, len(batches) // 10)
    out: dict[str, dict[str, Any]] = {}
    for tag in [t.tag for t in pipeline.cfg.tasks]:
        fin = carry["finished_stats"]
        row = None
        if all(f is not None for f in fin) and any(tag in f for f in fin):
            row = _learning_row(fin, k, tag, "finished episodes")
        # A window with no finished episode of the task (a short async run whose last
        # step saw none end): the batches, which always hold the task's groups.
        if row is None or row["reward_first_tenth"] is None or row["reward_last_tenth"] is None:
            row = _learning_row(batches, k, tag, "batches")
        out[tag] = row
    return out


def _learning_row(recs: list[Any], k: int, tag: str, over: str) -> dict[str, Any]:
    """:func:`learning_summary`'s row of ``tag`` from the per-step figures ``recs``."""

    def mean(rs: list[Any], key: str) -> float | None:
        total = count = 0.0
        for st in rs:
            st = (st or {}).get(tag)
            n = (st or {}).get("n_success" if key == "success" else "n") or 0.0
            if st is None or not n or st.get(key) is None:
                continue
            total += float(st[key]) * n
            count += n
        return total / count if count else None

    row: dict[str, Any] = {
        "over": over,
        "reward_first_step": mean(recs[:1], "reward"),
        "reward_last_tenth": mean(recs[-k:], "reward"),
        "success_first_step": mean(recs[:1], "success"),
        "success_last_tenth": mean(recs[-k:], "success"),
    }
    for key in ("reward", "success"):
        row.update(_tenths(recs, k, tag, key, mean))
    return row


def _tenths(recs: list[Any], k: int, tag: str, key: str, mean: Any) -> dict[str, Any]:
    """``<key>_first_tenth``/``_last_tenth`` with ``_sd`` (the spread of the steps'
    values) and ``<key>_change`` (see :func:`learning_summary`)."""
    first, last = recs[:k], recs[-k:]
    out: dict[str, Any] = {f"{key}_first_tenth": mean(first, key),
                           f"{key}_last_tenth": mean(last, key)}
    ses = []
    for name, part in (("first", first), ("last", last)):
        vals = [mean([st], key) for st in part]
        vals = [v for v in vals if v is not None]
        sd = None
        if len(vals) >= 2:
            m = sum(vals) / len(vals)
            sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
            ses.append(sd / math.sqrt(len(vals)))
        elif len(vals) == 1 and key == "success":
            n = sum(float((st.get(tag) or {}).get("n_success") or 0.0) for st in part)
            p = vals[0]
            if n:
                ses.append(math.sqrt(max(p * (1 - p), 0.25 / n) / n))
        out[f"{key}_{name}_tenth_sd"] = sd
    a, b = out[f"{key}_first_tenth"], out[f"{key}_last_tenth"]
    change = None
    if a is not None and b is not None and len(ses) == 2 and len(recs) >= 2:
        noise = 2.0 * math.sqrt(ses[0] ** 2 + ses[1] ** 2)
        change = ("no clear change" if abs(b - a) <= noise
                  else "up" if b > a else "down")
    out[f"{key}_change"] = change
    return out


def learning_lines(learning: dict[str, dict[str, Any]]) -> list[str]:
    """The end-of-run lines of ``rollart train``, one per task: success (else reward) over
    the first tenth of the steps -> over the last tenth, each +- its spread, and whether
    that is a change beyond the noise."""
    lines = []
    for tag, v in learning.items():
        key = "success" if v.get("success_last_tenth") is not None else "reward"
        if f"{key}_first_tenth" not in v:  # a summary.json written before the tenths
            lines.append(f"{tag}: {key} {_num(v[f'{key}_first_step'])} at the first step -> "
                         f"{_num(v[f'{key}_last_tenth'])} over the last tenth")
            continue

        def fig(name: str, v: dict[str, Any] = v, key: str = key) -> str:
            sd = v.get(f"{key}_{name}_tenth_sd")
            return _num(v[f"{key}_{name}_tenth"]) + (f" +- {sd:.2f}" if sd is not None else "")

        change = v.get(f"{key}_change")
        what = f"{key} of finished episodes" if v.get("over") == "finished episodes" else key
        verdict = {"up": "up", "down": "down", "no clear change": "no clear change",
                   None: "too few steps to tell"}[change]
        lines.append(f"{tag}: {what} {fig('first')} over the first tenth -> {fig('last')} "
                     f"over the last tenth ({verdict}; first step "
                     f"{_num(v[f'{key}_first_step'])})")
    return lines


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _reward_spans(traj: Trajectory) -> tuple[float, float | None]:
    """(the end of the trajectory's rollout, the end of its reward call or None)."""
    rollout_end = max((t1 for span, _, t1 in traj.timings if span != "reward"), default=0.0)
    rewards = [t1 for span, _, t1 in traj.timings if span == "reward"]
    return rollout_end, (rewards[-1] if rewards else None)


def reward_exposure(records: list[StepRecord], run_started: float) -> dict[str, Any]:
    """How much of each step waited on rewards (paper R3; ``rollart bench reward`` and
    ``rollart sim --experiment reward``).

    Per step: its duration (since the previous batch; the first since ``run_started``)
    and ``exposed_reward_s``, the time it waited on rewards only: from the later of "the
    trainer asked for the batch" and "the batch's last rollout ended" to "the batch's last
    reward arrived" (0 when the rewards were in before either). Plus every reward call's
    latency as the EnvManager saw it, and the batch's mean reward."""
    freed = [r.step for r in records if not r.batch]
    if freed:
        raise ValueError(
            f"reward_exposure needs every step's trajectories, but the batches of steps "
            f"{freed[:5]}{'...' if len(freed) > 5 else ''} were freed (the pipeline keeps "
            "the last KEEP_BATCHES steps'); measure runs of at most that many steps, or "
            "raise rollart_sdk.control.pipeline.KEEP_BATCHES for the measurement")
    steps = []
    previous = run_started
    for r in records:
        spans = [_reward_spans(t) for t in r.batch]
        reward_ends = [e for _, e in spans if e is not None]
        asked = r.formed_at - r.get_batch_wait_s
        exposed = 0.0
        if reward_ends:
            exposed = max(0.0, max(reward_ends) - max(asked, max(s for s, _ in spans)))
        steps.append({"step": r.step, "formed_at": r.formed_at, "step_s": r.formed_at - previous,
                      "wait_s": r.get_batch_wait_s, "exposed_reward_s": exposed})
        previous = r.formed_at
    latencies = [t1 - t0 for r in records for t in r.batch
                 for span, t0, t1 in t.timings if span == "reward"]
    rewards = [sum(float(t.reward or 0.0) for t in r.batch) / len(r.batch)
               for r in records if r.batch]
    return {"steps": steps, "reward_latencies_s": latencies, "rewards": rewards}
