"""StepRecord: what one iteration of the protocol did (control/pipeline.py), for the
metrics line, the summary and tests. Below the pipeline: the parts it hands a record to
(the weight updates fill in the update's figures) import it from here, not from the
pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollart_sdk.types import Trajectory


@dataclass
class StepRecord:
    """What one iteration did, for metrics and tests."""

    step: int
    version: int  # trainer version the batch was trained at
    batch: list[Trajectory]
    get_batch_wait_s: float
    # Version the engines served when the wait for the batch began (the batch's floor
    # counts from it; a swap inside the wait, ``Pipeline._next_batch``, moves the engines
    # on, not this).
    engine_version: int = 0
    formed_at: float = 0.0  # wall time the batch was formed
    # Run totals when the batch was formed (waste and length bias are read from them).
    launched: int = 0
    dropped: int = 0
    dropped_during_run: int = 0  # dropped, the run's end aborts excluded
    tokens_dropped: int = 0
    tokens_trained: int = 0
    finished_turns: dict[str, tuple[int, int]] = field(default_factory=dict)
    # ... and their outcomes: [rewarded, reward sum, judged, successes] (SampleBuffer).
    finished_outcomes: dict[str, tuple[int, float, int, int]] = field(default_factory=dict)
    train_s: float = 0.0
    # Sync with train.stream_groups: seconds from the batch's first group completing to the
    # batch being whole (the rollout's tail), and the parts sent before train_step.
    batch_spread_s: float | None = None
    weight_sync_exposed_s: float = 0.0  # the whole window rollout waited (weight_updates.py)
    weight_transfer_s: float = 0.0  # the background receive (slowest engine)
    weight_recompute_s: float = 0.0  # engines' KV recompute after the swap (slowest engine)
    weight_sync_baseline_s: float | None = None  # the same update with nothing overlapping
    weight_sync_nbytes: int = 0
    weight_sync_wait_s: float = 0.0  # waiting for the staged version the bound required
    weight_deferred: int | None = None  # version not yet arrived at this suspend point
    weight_sync_failed: int | None = None  # version whose transfer failed (engines kept theirs)
    recomputed: int = 0  # in-flight requests whose KV cache the update rebuilt
    weight_sync_direct: int = 0  # engines whose own workers received it (the collective path)
    train_metrics: dict[str, float] = field(default_factory=dict)
    aborted_stale: int = 0
    aborted_surplus: int = 0
    trained_total: int = 0  # trajectories trained on, this step included
    # Per task: mean reward and success rate of the batch (kept when ``batch`` is freed).
    task_stats: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # The batch's share of the run summary, kept when ``batch`` is freed: trajectories
    # trained across a weight update, staleness (engine version - start version) counts,
    # and per task (trajectories, turns) trained.
    spanning: int = 0
    staleness: dict[int, int] = field(default_factory=dict)
    trained_turns: dict[str, tuple[int, int]] = field(default_factory=dict)
    in_flight: int = 0  # launched, neither trained nor dropped yet (at the batch's formation)
    # Dynamic sampling (rollout.filter_zero_variance), since the previous batch: groups
    # filtered (dropped as zero_variance), and per task the rewards of the equal-reward
    # groups kept past the cap (max_filtered_per_step). None: the filter is off.
    filtered_groups: int | None = None
    zero_variance_kept: dict[str, list[float | None]] = field(default_factory=dict)


def staleness(rec: StepRecord, traj: Trajectory) -> int:
    """The paper's staleness of ``traj`` in ``rec``'s batch: the engines' version when the
    batch's wait began minus its start version; 0 for one started after a swap inside
    that wait (it sampled the newest weights)."""
    return max(0, rec.engine_version - traj.start_version)


def outcomes(counts: dict[str, list[float]]) -> dict[str, tuple[int, float, int, int]]:
    """``SampleBuffer.finished_outcomes`` as a record keeps them (a copy)."""
    return {tag: (int(v[0]), float(v[1]), int(v[2]), int(v[3])) for tag, v in counts.items()}
