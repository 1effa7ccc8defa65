"""The asynchronous training protocol (paper section 6.3), one place to read it.

Every iteration:

1. get_batch  - block until the SampleBuffer holds ``batch_size`` trajectories in whole
                groups, evicting groups started before ``engine version - alpha`` (the
                version the engines serve while the batch is formed: the paper's bound);
2. suspend    - the LLMProxy stops admitting requests; in-flight trajectories are kept;
3. update     - every engine worker swaps in the staged weights, which it has been
                receiving in the background since the trainer published them. In async
                mode (``rollout.defer_weight_update``, default auto) a version that has not
                fully arrived on every engine yet is not waited for: the engines keep
                generating on the old version and swap at a later suspend point, as long
                as alpha allows (``control/weight_updates.py``);
4. resume     - the LLMProxy admits requests again;
5. recompute  - inside the engines' swap: in-flight requests get their KV cache rebuilt
                under the new weights and continue (not restart); their tokens carry the
                version that produced each one, and the trainer corrects the older ones;
6. train_step - on the batch from step 1, overlapping the resumed rollout; when it ends
                the trainer publishes the new version and engines start receiving it.

``mode`` turns the same loop into the paper's baselines:

- ``sync``: a quota of ``batch_size * (1 + redundancy)`` launches per iteration, surplus
  aborted once the batch is full, training and the update finish before the next batch
  generates: every trained token comes from the version being trained (on-policy). With
  ``rollout.reset_ahead`` (default) the next quota launches when training starts: its
  environments reset meanwhile and each waits after its reset (``StartGate``) until the
  update is in;
- ``one_off``: the next iteration's quota launches right after the update, so rollout of
  batch k+1 overlaps training on batch k (trained one version behind the trainer);
- ``async``: environments run continuously under admission control (the scheduler starts
  a trajectory only while it can still land in a batch within ``alpha``); trajectories in
  flight across an update continue. Only a trajectory that can no longer land in any
  batch (it outlived the bound) is aborted, counted as ``stale``.

``rollout.interaction: batched`` makes the environments of one iteration step in lockstep
(sync / one_off): the paper's plain Sync when mode is sync.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rollart_sdk.cluster.handles import WorkerHandle
from rollart_sdk.cluster.shards import shard_batch
from rollart_sdk.config import RunConfig
from rollart_sdk.control.aio import wait_for
from rollart_sdk.control.buffer import SampleBuffer
from rollart_sdk.control.collector import YOUNG_THRESHOLD, DriverCollector, driver_collector
from rollart_sdk.control.lockstep import StartGate
from rollart_sdk.control.metrics import step_metrics
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.control.records import StepRecord, outcomes
from rollart_sdk.control.records import staleness as paper_staleness
from rollart_sdk.control.recovery import EngineRecovery
from rollart_sdk.control.scheduler import RolloutScheduler
from rollart_sdk.control.stream_groups import StreamedParts, stream_pays
from rollart_sdk.control.versions import PolicyVersions
from rollart_sdk.control.watchdog import RunFailure, Watchdog
from rollart_sdk.control.weight_updates import WeightUpdates
from rollart_sdk.types import TrainSample, Trajectory, WeightManifest, WeightUpdateReport
from rollart_sdk.weights.sync import WeightSync

if TYPE_CHECKING:
    from rollart_sdk.cluster.handles import TrainerClient

T = TypeVar("T")

# At the end of a completed run, how long an engine's restart + reload may still take (so
# that every engine ends on one version); past it the engine is reported as not back.
RECOVERY_WAIT_S = 120.0
KEEP_BATCHES = 16  # steps whose trained trajectories stay in ``Pipeline.records``
# Periodic checkpoint saves that may fail in a row before the run stops (docs/failures.md).
MAX_CHECKPOINT_FAILURES = 3


class Pipeline:
    def __init__(
        self,
        config: RunConfig,
        proxy: LLMProxy,
        scheduler: RolloutScheduler,
        buffer: SampleBuffer,
        trainers: list[WorkerHandle],
        on_step: Callable[[StepRecord, dict[str, Any]], None] | None = None,
        protocol_log: list[str] | None = None,
        checkpoint_dir: str | None = None,
        event_sink: Callable[[dict[str, Any]], None] | None = None,
        weight_sync: WeightSync | None = None,
        versions: PolicyVersions | None = None,
        *,
        watchdog: Watchdog | None = None,
        rebind: Callable[[str], None] | None = None,
        say: Callable[[str], None] | None = None,
        on_eval: Callable[[dict[str, Any]], None] | None = None,
        evaluator: Any = None,
    ) -> None:
        self.cfg = config
        self.proxy = proxy
        # Stages/commits each published version on every engine (default: the proxy's,
        # those it marked down left out of updates).
        self.weight_sync = weight_sync or WeightSync(list(proxy.workers.values()), proxy)
        self.scheduler = scheduler
        self.buffer = buffer
        self.trainers = trainers
        self.on_step = on_step
        self.log = protocol_log if protocol_log is not None else []
        self.checkpoint_dir = checkpoint_dir
        self._emit = event_sink or (lambda e: None)
        self.versions = versions or PolicyVersions()  # shared with the scheduler
        # Every step's record; the trajectories of all but the last KEEP_BATCHES steps are
        # freed once reported (memory stays flat over a long run).
        self.records: list[StepRecord] = []
        self._collector = DriverCollector(YOUNG_THRESHOLD, active=False)  # run() sets it
        self._in_flight_hint = 0
        self._stream = False  # sync: batches taken group by group (_streams)
        self._send_parts = False  # ... and this step's groups sent as they come (stream_pays)
        self._spread = 0.0  # the last streamed batch's first take to its last, seconds
        self._parts: StreamedParts | None = None  # ... those of the step being streamed
        self._untrained: dict[int, list[Trajectory]] = {}  # step -> its batch, in training
        self._dropped_untrained: dict[int, list[Trajectory]] = {}  # ... when the run stopped
        # Resume (control/resume.py): the first step of this session, the wall time and
        # resumes of the sessions before it; trajectories trained per task up to a step.
        self.first_step = 0
        self.wall_offset = 0.0
        self.resumes = 0
        self.trained_by_tag: Counter[str] = Counter()
        self.trained_by_tag_at: dict[int, Counter[str]] = {}  # steps done -> per task
        # The summary figures of the sessions before a resume, and the run totals this
        # session started from (the first step's per-step deltas count from them).
        self.carried: dict[str, Any] = {}
        self.session_start: StepRecord | None = None
        self._reported = 0  # steps whose metrics line is written
        # Checkpoints (control/checkpoints.py): the one this session resumed from (never
        # pruned), the steps it saved, failed saves in a row and their lines, the last
        # save's time (monotonic); ``say`` prints a line for the user.
        self.resumed_from: str | None = None
        self.saved_steps: set[int] = set()
        self.checkpoint_failures = 0
        self.checkpoint_errors: list[str] = []
        self._last_save = time.monotonic()
        self.say: Callable[[str], None] = say or (lambda line: None)
        self._ready_at_end: list[Trajectory] = []  # ready groups when the run stopped
        # The stall clock and the drop-rate rule; it reads every finished trajectory from
        # the run's RolloutEvents (the composition root made it one of its readers).
        self.watchdog = watchdog or run_watchdog(config)
        if self.watchdog.record not in scheduler.events.finish_readers:
            raise ValueError("the watchdog must read the finished trajectories: build the "
                             "scheduler's RolloutEvents with on_finish=[watchdog.record, ...] "
                             "and pass the watchdog (rollart_sdk/job/wire.py does)")
        r = config.rollout
        self.alpha = r.effective_alpha
        # Published, staged and served versions; the suspend point's swap (deferred while
        # the next version is arriving, as far as alpha allows).
        self.weights = WeightUpdates(
            self.weight_sync, proxy, self.versions, mode=r.mode, alpha=self.alpha,
            defer=r.defer_weight_update, log=self.log, emit=self._emit,
            trainer=trainers[0].trainer if trainers else None, events=scheduler.events)
        self.sync_lock = self.weights.lock
        self.recovery = EngineRecovery(proxy, self.weights, rebind=rebind, emit=self._emit,
                                       say=self.say)
        self.started = time.time()
        self.ended: float | None = None
        self.quota = task_quota(config)
        self.launch_per_step = launches_per_step(config)
        # Held-out evaluation (config ``eval:``, control/evaluation.py): given by the job
        # when ``eval.every_steps`` > 0; each evaluation's metrics line goes to ``on_eval``.
        self.evaluator: Any = evaluator
        self.on_eval = on_eval
        self.eval_lines: list[dict[str, Any]] = []

    @property
    def engine_version(self) -> int:
        """The version every engine serves."""
        return self.versions.engine

    @engine_version.setter
    def engine_version(self, v: int) -> None:
        self.versions.engine = v

    @property
    def trainer_version(self) -> int:
        """The version the trainer holds (= train steps done)."""
        return self.versions.trainer

    @trainer_version.setter
    def trainer_version(self, v: int) -> None:
        self.versions.trainer = v

    # ------------------------------------------------------------------ protocol pieces
    async def _train(self, step: int, batch: list[Trajectory]) -> StepRecord:
        rec = self.records[step - self.first_step]
        t0 = time.perf_counter()
        sent = 0
        if self._parts is not None and self._parts.step == step:
            # Streamed (sync, train.stream_groups): the groups sent while the batch formed
            # are in the trainer; their forward and backward finish first (a failed one
            # fails the step here), then the rest ends the step.
            sent = self._parts.sent
            await self._trainer_call(self._parts.drain(), "accumulate")
        # Advantages are the trainer's (its options, over the batch on all its ranks).
        samples: list[TrainSample] = [s for t in batch[sent:] for s in t.to_samples()]
        # TrainerWorker.train_step is @register("dp_split"): shard by that one rule; on
        # Ray each shard goes into the object store once and its rank gets a reference.
        shards = shard_batch(samples, self.trainers)
        results = await self._trainer_call(asyncio.gather(
            *(w.trainer.train_step(shard)
              for w, shard in zip(self.trainers, shards, strict=True))
        ), "train_step")
        self._parts = None
        rec.train_s = time.perf_counter() - t0
        if self._stream:
            rec.batch_spread_s = self._spread
            if self.cfg.train.stream_groups == "auto":
                # The next step sends its groups early if this step's tail was long
                # enough to hide their training in (stream_pays).
                m = results[0]
                cost = float(m.get("time/train_compute", 0.0)) + float(
                    m.get("time/train_accumulate", 0.0))
                self._send_parts = stream_pays(self._spread, cost)
        self._count_trained(step, batch)
        self._span("train", self.trainers[0].name, t0, step)
        rec.train_metrics = dict(results[0])
        self.trainer_version += 1
        self.weights.last_train_s = rec.train_s  # defer_weight_update: auto weighs it
        t1 = time.perf_counter()
        manifest = await self._publish()
        self.log.append(f"publish:{manifest.version}")
        # Push transports (nccl) size each round by how many engines receive the version:
        # the live ones (a down engine would make the round wait for it and fail; it
        # loads the current version when it is back: control/recovery.py).
        manifest.meta["receivers"] = len(self.weight_sync.live())
        await self.weights.on_publish(manifest)
        self._span("publish", self.trainers[0].name, t1, step)
        self.watchdog.progress()
        if self.cfg.rollout.mode != "sync":
            await self.weights.settle(rec)
            self._report(rec)  # the step ended: its metrics line now, not a step later
            # After the line: a checkpoint of N steps always has N metrics lines before
            # it (a kill between the two would otherwise leave a gap after a resume).
            if self._checkpoint_due(step + 1):
                await self._periodic_checkpoint(step + 1)
        return rec

    def _checkpoint_due(self, done: int) -> bool:
        """A periodic checkpoint after ``done`` steps: every ``train.checkpoint_every``
        steps, or ``train.checkpoint_every_s`` seconds after the last save (or the run's
        start)."""
        t = self.cfg.train
        if not self.checkpoint_dir:
            return False
        by_steps = bool(t.checkpoint_every) and done % t.checkpoint_every == 0
        by_time = bool(t.checkpoint_every_s) and (
            time.monotonic() - self._last_save >= t.checkpoint_every_s)
        return by_steps or by_time

    async def _end_sync_step(self, step: int, steps: int,
                             training: asyncio.Task[StepRecord]) -> bool:
        """Sync mode, once batch ``step`` went to the trainer: the next step's launches
        when they may go ahead (``_reset_ahead``: held at a :class:`StartGate` after their
        env resets), the training, the update, then the gate opens; the step's line, the
        evaluation and the checkpoint due. Returns whether the next step was launched."""
        gate = None
        if self._reset_ahead(step + 1, steps):
            gate = StartGate()
            self.log.append(f"reset_ahead:{step + 1}")
            self.scheduler.allow(self.launch_per_step, gate=gate)
        done = await self._guarded(training)
        await self._guarded(self.weights.update(done))
        await self._guarded(self.weights.settle(done))
        if gate is not None:
            gate.open()  # the engines serve the version just trained
        self._report(done)
        await self._evaluate(step + 1, steps, "sync")
        # After its line, as in _train; a checkpoint that fell due by time while the
        # next step's trajectories were held is taken after the next step.
        if gate is None and self._checkpoint_due(step + 1):
            await self._guarded(self._periodic_checkpoint(step + 1))
        return gate is not None

    def _reset_ahead(self, done: int, steps: int) -> bool:
        """Sync mode: launch step ``done``'s trajectories while step ``done - 1`` trains
        (``rollout.reset_ahead``): their environments reset meanwhile and their first
        generations wait for the new weights. Not for the last step, nor when an
        evaluation or a checkpoint falls due after this step (those run with no
        trajectory in flight, as a sync step leaves them)."""
        if not self.cfg.rollout.reset_ahead or done >= steps:
            return False
        if self._eval_due(done, steps, "sync"):
            return False
        return not self._checkpoint_due(done)

    async def _periodic_checkpoint(self, done: int) -> None:
        """Save; a failed save (disk full, permission) leaves the earlier checkpoints as
        they were, is said in one line, and training goes on, unless
        ``MAX_CHECKPOINT_FAILURES`` saves in a row failed: then the run stops (its
        training since the newest checkpoint would be at risk)."""
        try:
            await self.save_checkpoint(done)
        except Exception as exc:  # said, counted, and a rule decides
            self._last_save = time.monotonic()  # try again one interval later
            self.checkpoint_failures += 1
            newest = self.newest_checkpoint_name()
            line = (f"checkpoint step-{done} failed: {type(exc).__name__}: {exc}"[:600]
                    + f"; {newest or 'no checkpoint'} stays the newest "
                    f"({self.checkpoint_failures} in a row; the run stops at "
                    f"{MAX_CHECKPOINT_FAILURES}): free space or fix the permissions of "
                    f"{self.checkpoint_dir}")
            self.checkpoint_errors.append(line)
            self.say(f"warning: {line}")
            if self.checkpoint_failures >= MAX_CHECKPOINT_FAILURES:
                raise RunFailure(f"{MAX_CHECKPOINT_FAILURES} checkpoint saves in a row failed "
                                 f"(last: {line})") from exc

    async def save_checkpoint(self, done: int, version: int | None = None,
                              reason: str = "periodic") -> str:
        """Save the run at ``done`` steps as ``checkpoints/step-<done>``: the trainer
        ranks write into a fresh hidden folder, then the run state and the manifest are
        added, everything is fsynced and the folder renamed into place; older ones are
        pruned (control/checkpoints.py). A checkpoint of ``done`` steps this session wrote
        or resumed from is kept as it is. Returns its path; raises on a failed save, after
        removing what it wrote."""
        import shutil
        from pathlib import Path

        from rollart_sdk import durable
        from rollart_sdk.control import checkpoints
        from rollart_sdk.control.resume import CARRIED_FILE, capture_state

        assert self.checkpoint_dir is not None
        root = Path(self.checkpoint_dir)
        target = root / checkpoints.step_name(done)
        if done in self.saved_steps or (self.resumed_from is not None
                                        and Path(self.resumed_from) == target):
            return str(target)
        partial = checkpoints.partial_dir(root, done)
        t0 = time.perf_counter()
        try:
            await self._trainer_call(
                self.all_trainers(lambda t: t.save_checkpoint(str(partial))), "save_checkpoint")
            state = capture_state(self, done, version)
            carried = state.pop("_carried")  # pickled now: later changes are not saved
            meta = {"version": state["version"], "reason": reason}
            keep = self.cfg.train.keep_checkpoints
            protect = {Path(self.resumed_from)} if self.resumed_from else set()

            def publish() -> None:
                partial.mkdir(parents=True, exist_ok=True)  # a trainer that wrote nothing
                (partial / CARRIED_FILE).write_bytes(carried)
                checkpoints.seal(partial, root, done, state, meta)
                checkpoints.prune(root, keep, protect, upto_step=done)

            # Checksums read every file: off the event loop, rollout goes on meanwhile.
            await asyncio.to_thread(publish)
        except BaseException:
            # What it wrote, and the hidden folder of a trainer that wrote the durable way
            # (rollart_sdk.durable.new_dir) and could not clean up: a full disk gets its
            # space back.
            for left in (partial, durable.partial_name(partial)):
                shutil.rmtree(left, ignore_errors=True)
            raise
        self.saved_steps.add(done)
        self.checkpoint_failures = 0
        self._last_save = time.monotonic()
        self._span("checkpoint", self.trainers[0].name, t0, done)
        self.log.append(f"checkpoint:{done}")
        return str(target)

    @property
    def steps_done(self) -> int:
        """Steps trained and reported (a metrics line each), sessions before a resume too."""
        return self._reported

    def finished_untrained(self) -> tuple[list[Trajectory], int]:
        """The finished, untrained trajectories a checkpoint saved now carries (ready groups
        and batches handed out but not trained), and how many of them the run's end
        already counted dropped (``run_end``: a save after the run stopped)."""
        if self.ended is None:
            return (self.buffer.ready_members()
                    + [t for batch in self._untrained.values() for t in batch]), 0
        out = self._ready_at_end + [t for b in self._dropped_untrained.values() for t in b]
        return out, len(out)

    def newest_checkpoint_name(self) -> str | None:
        from rollart_sdk.control import checkpoints

        if not self.checkpoint_dir:
            return None
        found = checkpoints.complete(self.checkpoint_dir)
        return found[0].name if found else None

    def _count_trained(self, step: int, batch: list[Trajectory]) -> None:
        """Step ``step``'s train call returned: its batch counts as trained, once. If the
        run stopped meanwhile, the stop already counted it dropped (run_end): redeemed."""
        dropped = self._dropped_untrained.pop(step, None)
        if dropped is not None:
            self.buffer.redeem_untrained(dropped, "run_end")
        else:
            self.buffer.mark_trained(self._untrained.pop(step, batch))

    async def _trainer_call(self, awaitable: Awaitable[T], what: str) -> T:
        """A trainer call bounded by ``train.call_timeout_s`` (a stuck collective fails)."""
        limit = self.cfg.train.call_timeout_s
        try:
            return await wait_for(awaitable, limit)
        except TimeoutError:
            raise RunFailure(
                f"trainer {what} did not finish within {limit:g}s (train.call_timeout_s); "
                "the trainer is stuck (e.g. a data-parallel collective lost a peer)"
            ) from None

    async def _guarded(self, awaitable: Any) -> Any:
        """Await ``awaitable`` unless the watchdog trips or the scheduler hit a bug first."""
        task = asyncio.ensure_future(awaitable)
        guard = asyncio.ensure_future(self._guard())
        try:
            done, _ = await asyncio.wait({task, guard}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            guard.cancel()
        if task in done:
            return task.result()
        task.cancel()
        return guard.result()  # raises

    async def _guard(self) -> None:
        while True:
            fatal = self.scheduler.fatal
            if fatal is not None:
                raise RunFailure(
                    "a bug in the control plane ended a trajectory (not retried):\n"
                    f"{self.scheduler.fatal_traceback}"
                ) from fatal
            self.watchdog.check_stall()
            if self.watchdog.failure is not None:
                raise self.watchdog.failure
            await asyncio.sleep(0.5)

    async def all_trainers(self, call: Callable[[TrainerClient], Awaitable[T]]) -> list[T]:
        """``call`` every trainer rank at once (``lambda t: t.save_checkpoint(path)``),
        results in rank order.

        Export and checkpoint calls are collective for a trainer whose ranks hold
        different shards (tensor parallel); a data-parallel trainer's ranks != 0 return
        at once."""
        return list(await asyncio.gather(*(call(w.trainer) for w in self.trainers)))

    async def _publish(self) -> WeightManifest:
        """Every rank takes part (a tensor-parallel trainer gathers its shards to export);
        rank 0 publishes and returns the manifest."""
        bucket_bytes = int(self.cfg.train.bucket_mb * 2**20)
        manifests = await self._trainer_call(
            self.all_trainers(lambda t: t.publish_weights(bucket_bytes)), "publish_weights")
        if manifests[0] is None:
            raise RunFailure(f"trainer rank 0 ({self.trainers[0].name}) published no "
                             "manifest (only rank 0 holds the transport's sending side)")
        return manifests[0]

    def _span(self, span: str, worker: str, t0_perf: float, step: int) -> None:
        """Timeline event for a pipeline stage (``t0_perf`` from perf_counter)."""
        now_wall, now_perf = time.time(), time.perf_counter()
        self._emit({"trajectory": None, "tag": None, "span": span, "worker": worker,
                    "step": step, "t0": now_wall - (now_perf - t0_perf), "t1": now_wall})

    @property
    def update_reports(self) -> list[WeightUpdateReport]:
        return self.weights.reports

    @property
    def sync_baseline_s(self) -> float | None:
        """The baseline update's seconds (pull + swap + recompute, nothing overlapping)."""
        return self.weights.baseline_s

    # ------------------------------------------------------------------ the loop
    async def run(self, steps: int) -> list[StepRecord]:
        # The collector's passes stay flat per trajectory as the trajectories in flight
        # grow (control/collector.py): its young threshold follows them, step by step.
        # The hint: what a step's rollout has in flight at its peak, at least (max_envs,
        # else the batch: a sync step launches its whole batch at once). A step's record
        # counts what is in flight when its batch is whole (async: the rollout going on;
        # sync: only the surplus), so the threshold follows the larger of the two.
        r = self.cfg.rollout
        self._in_flight_hint = r.max_envs or r.batch_size
        with driver_collector() as self._collector:
            self._collector.fit(self._in_flight_hint)
            return await self._run(steps)

    async def _run(self, steps: int) -> list[StepRecord]:
        mode = self.cfg.rollout.mode
        batch_size = self.cfg.rollout.batch_size
        self.started = time.time()
        # The stall clock and the checkpoint interval start now, not when the pipeline
        # was built (a resume's checkpoint load and weight push may take long).
        self.watchdog.restart()
        self._last_save = time.monotonic()
        await self._evaluate(self.first_step, steps, "start")
        self._stream = await self._streams()
        self.scheduler.start(quota=self.launch_per_step if mode != "async" else None)
        pending: asyncio.Task[StepRecord] | None = None
        ahead = False  # sync: this step's launches were made while the last one trained
        completed = False
        try:
            for step in range(self.first_step, steps):
                await self._evaluate(step, steps, "beside")
                if mode == "sync" and step > self.first_step and not ahead:
                    self.scheduler.allow(self.launch_per_step)
                self.log.append(f"get_batch:{step}")
                t0, served = time.perf_counter(), self.engine_version
                batch, early = await self._next_batch(step, batch_size, pending)
                self._untrained[step] = batch
                rec = self._record(step, batch, time.perf_counter() - t0, served, early)
                self._collector.fit(max(rec.in_flight, self._in_flight_hint))
                if mode != "async":
                    # The batch is full: the rest of this iteration's launches is surplus.
                    self.buffer.discard_all("surplus")
                    rec.aborted_surplus = await self._guarded(self.scheduler.abort_all("surplus"))
                if pending is not None:
                    await self._guarded(pending)
                    pending = None
                # Engine calls (suspend, swap, resume, abort) are guarded too: an engine
                # that hangs without dying ends the run at the stall timeout, named.
                await self._guarded(self.weights.update(rec))
                if mode == "async":
                    # Started before the next batch's floor: no batch can take it any more
                    # (it outlived the bound despite admission control); free its slot.
                    floor = self.weights.batch_floor(step + 1)
                    rec.aborted_stale = await self._guarded(self.scheduler.abort_where(
                        lambda t, floor=floor: t.start_version < floor, "stale"  # type: ignore[misc]
                    ))
                elif mode == "one_off" and step + 1 < steps:
                    self.scheduler.allow(self.launch_per_step)
                self.log.append(f"train_step:{step}")
                pending = asyncio.create_task(self._train(step, batch))
                if mode == "sync":
                    ahead = await self._end_sync_step(step, steps, pending)
                    pending = None
            if pending is not None:
                await self._guarded(pending)
            await self._evaluate(steps, steps, "beside")
            completed = True
        finally:
            self._cancel_training(pending)
            self.ended = time.time()  # the rollout stopped (before the run-end cleanup)
            # A batch handed out whose train step did not return was not trained.
            # (report_trained redeems one the trainer did finish, its answer lost.)
            for step_, batch in self._untrained.items():
                self.buffer.drop_untrained(
                    batch, "run_end: the run stopped before this batch's train step returned")
                self._dropped_untrained[step_] = batch
            self._untrained.clear()
            await self.scheduler.stop("run_end")
            self._ready_at_end = self.buffer.ready_members()  # the final save carries them
            self.buffer.discard_all("run_end")
            await self.weights.close()
            await self.recovery.close(wait_s=RECOVERY_WAIT_S if completed else 0.0)
        return self.records

    async def _streams(self) -> bool:
        """Whether sync batches are taken group by group, their groups sent to the
        trainer as they complete (``train.stream_groups`` true: every step; auto: the
        steps ``stream_pays`` picks; sync mode, one trainer rank that can add a step up
        from parts). Said in the protocol log."""
        want = self.cfg.train.stream_groups
        if self.cfg.rollout.mode != "sync" or want is False:
            return False
        can = len(self.trainers) == 1 and await self._trainer_call(
            self.trainers[0].trainer.can_accumulate(), "can_accumulate")
        if not can:
            raise RunFailure(
                f"train.stream_groups is {str(want).lower()} but trainer "
                f"{self.trainers[0].name} cannot add a step up from parts (it needs one "
                f"rank, {len(self.trainers)} here, a trainer with accumulate, and "
                "updates_per_batch 1): set train.stream_groups to false")
        self._send_parts = want is True
        self.log.append(f"stream_groups:{want}")
        return True

    async def _stream_batch(self, step: int) -> list[Trajectory]:
        """Sync batch ``step`` group by group (``train.stream_groups``). When this step
        sends parts (true: every step; auto: when the last one said it pays,
        ``stream_pays``), each take of ready groups that leaves the batch short goes to
        the trainer's ``accumulate`` at once (forward and backward
        while the rollout's slowest episodes finish; one call at a time, in order); the
        take that makes it whole is kept for ``train_step``, which ends the step. The
        groups are those ``get_batch`` would take (each task's first ready groups), the
        gradient the whole batch's. The wait's time is the step's ``get_batch_wait_s`` as
        before, the first take to the last its ``batch_spread_s``; the trainer's time in
        the parts is its ``time/train_accumulate``."""
        need = dict(self.quota)
        floor = self.weights.batch_floor(step)
        taken = self._untrained.setdefault(step, [])
        self._parts = parts = StreamedParts(step, self.trainers[0], self._span)
        first: float | None = None
        while True:
            get = asyncio.ensure_future(self.buffer.take_groups(need, floor))
            try:
                groups = await self._guarded(get)
            finally:
                # A stop landing after the take: its groups are the step's (_keep_taken).
                if get.done() and not get.cancelled() and get.exception() is None:
                    taken.extend(get.result())
                else:
                    get.cancel()
            now = time.perf_counter()
            first = now if first is None else first
            if all(n <= 0 for n in need.values()):
                self._spread = now - first
                return taken
            if self._send_parts:
                parts.send(groups)

    def _cancel_training(self, pending: asyncio.Task[StepRecord] | None) -> None:
        """The run stops: a train step still running, and groups sent for a step that
        will not train, are cancelled."""
        if pending is not None and not pending.done():
            pending.cancel()
        if self._parts is not None:
            self._parts.cancel()
            self._parts = None

    async def _next_batch(self, step: int, batch_size: int, pending: asyncio.Task[StepRecord] | None
                          ) -> tuple[list[Trajectory], StepRecord | None]:
        """Batch ``step``; and, in async mode, should the training step before it end
        while the batch still forms, its weights go to the engines at once (a suspend
        point inside the wait), not after the batch: every trajectory started from then
        on samples the newest version. Waiting for the batch first started the next
        batch's trajectories on the version before (admission counts from the engines'),
        so that batches were trained two versions after their weights (``staleness/
        trainer_max`` 2 on most steps of ``rollart bench small``'s async runs).

        The wait for the batch is given up (it took nothing) before the swap and asked
        again after it, so no batch forms while the engines swap. The floor stays the
        batch's (``WeightUpdates.batch_floor``: trained at most ``alpha + 1`` versions
        after it started, as without the early swap): the swap gives the trajectories
        started from then on newer weights and evicts nothing more (a floor following the
        engines evicted the long episodes that alpha 2 is there to keep). The update's
        figures (``early``) go into the step's record."""
        if self._stream:
            return await self._stream_batch(step), None
        early: StepRecord | None = None
        if self.cfg.rollout.mode == "async" and pending is not None:
            get = asyncio.ensure_future(self._get_batch(step, batch_size))
            try:
                await self._guarded(asyncio.wait({get, pending},
                                                 return_when=asyncio.FIRST_COMPLETED))
                if get.done():
                    return get.result(), None
                get.cancel()  # not done: it took nothing out of the buffer
                await asyncio.gather(get, return_exceptions=True)
            finally:
                self._keep_taken(step, get)
            pending.result()  # a failed training step ends the run here
            early = StepRecord(step=step, version=-1, batch=[], get_batch_wait_s=0.0)
            self.log.append(f"update_in_wait:{step}")
            await self._guarded(self.weights.update(early))
        get = asyncio.ensure_future(self._get_batch(step, batch_size))
        try:
            return await self._guarded(get), early
        finally:
            self._keep_taken(step, get)

    def _keep_taken(self, step: int, get: asyncio.Future[list[Trajectory]]) -> None:
        """A wait for batch ``step`` ends (answered, given up, or the run stopped): a batch
        it took out of the buffer is the step's (``_untrained``: trained, or counted dropped
        when the run stops). A stop (SIGTERM cancels the run) landing after the get had
        taken its groups but before the run's task woke to read them lost the batch: 8
        trajectories neither trained nor dropped in a fresh-clone CI run. A get not done is
        cancelled (it took nothing)."""
        if get.done() and not get.cancelled() and get.exception() is None:
            self._untrained.setdefault(step, get.result())
        else:
            get.cancel()

    def _get_batch(self, step: int, batch_size: int) -> Awaitable[list[Trajectory]]:
        # The staleness bound: trajectories started at >= the batch's floor
        # (WeightUpdates.batch_floor; a swap inside the wait does not move it).
        return self.buffer.get_batch(batch_size, min_version=self.weights.batch_floor(step),
                                     quota=self.quota)

    # ------------------------------------------------------------------ evaluation
    def _eval_due(self, done: int, steps: int, where: str) -> bool:
        """Before step 1 (``where`` "start"; not in a resumed session), every
        ``eval.every_steps`` steps and after the last one: in sync mode after the step's
        line ("sync"), else at the top of the next iteration or after the loop ("beside")."""
        every = self.cfg.eval.every_steps if self.cfg.eval is not None else 0
        if self.evaluator is None or not every or (done % every and done != steps):
            return False
        if where == "start":
            return done == 0
        return (where == "sync") == (self.cfg.rollout.mode == "sync") and done > self.first_step

    async def _evaluate(self, done: int, steps: int, where: str) -> None:
        """The held-out evaluation after ``done`` steps, when it is due (``_eval_due``).
        Sync mode runs it between steps, when no trajectory is in flight; one_off / async
        beside the running rollout (no weight swap happens during it; the engines serve
        the version each line's ``eval/<tag>/version`` says). Its episodes never reach the
        buffer or the trainer; its time does not count as a stall."""
        if not self._eval_due(done, steps, where):
            return
        from rollart_sdk.control.evaluation import metric_line

        t0 = time.perf_counter()
        results = await self.evaluator.run()
        seconds = time.perf_counter() - t0
        self.watchdog.pause(seconds)
        line = metric_line(results, done, seconds)
        self.eval_lines.append(line)
        self.log.append(f"eval:{done}")
        if self.on_eval is not None:
            self.on_eval(line)

    # ------------------------------------------------------------------ resume
    def wall_s(self) -> float:
        """Seconds of pipeline run time, the sessions before a resume included."""
        return self.wall_offset + (self.ended or time.time()) - self.started

    async def restore(self, ckpt: str, state: dict[str, Any]) -> None:
        """Continue from checkpoint ``ckpt``: the trainer loads it (model, optimiser,
        RNG), every engine is given its weights (stage everywhere, then commit), and the
        counters, step numbering and scheduler RNG continue from ``state``."""
        from rollart_sdk.control.resume import CheckpointUnusable, apply_state, read_carried

        try:
            await self._trainer_call(
                self.all_trainers(lambda t: t.load_checkpoint(ckpt)), "load_checkpoint")
            version = await self.trainers[0].trainer.version()
        except Exception as exc:  # the caller tries the next checkpoint
            raise CheckpointUnusable(ckpt, f"the trainer could not load it: "
                                     f"{type(exc).__name__}: {exc}"[:800]) from exc
        if version != int(state["version"]):
            raise CheckpointUnusable(ckpt, f"the trainer loaded version {version} but the run "
                                     f"state says {state['version']} (inconsistent)")
        carried = read_carried(ckpt)
        apply_state(self, state, carried)
        self.resumed_from = ckpt
        self.trainer_version = version
        manifest = await self._publish()
        manifest.meta["receivers"] = len(self.weight_sync.live())
        await self.weight_sync.stage(manifest)
        await self.weight_sync.commit()
        self.weights.manifests[version] = manifest  # served: a restarted engine reloads it
        self.weights.published = version
        self.engine_version = version
        self.log.append(f"restore:{version}")
        self.watchdog.restart()

    # ------------------------------------------------------------------ metrics
    def _record(self, step: int, batch: list[Trajectory], wait_s: float, served: int,
                early: StepRecord | None = None) -> StepRecord:
        """``served``: the engines' version when the wait for ``batch`` began."""
        b = self.buffer
        run_end = sum(n for k, n in b.dropped.items() if k.endswith("run_end"))
        # Batches handed out (this one included) count as trained in the step's figures.
        handed = [t for batch_ in self._untrained.values() for t in batch_]
        rec = StepRecord(
            step, step, batch, wait_s, engine_version=served, formed_at=time.time(),
            launched=self.scheduler.launched, dropped=sum(b.dropped.values()),
            dropped_during_run=sum(b.dropped.values()) - run_end,
            tokens_dropped=b.tokens_dropped,
            tokens_trained=b.tokens_trained + sum(t.generated_tokens for t in handed),
            finished_turns={k: (v[0], v[1]) for k, v in b.finished_turns.items()},
            finished_outcomes=outcomes(b.finished_outcomes),
            trained_total=b.trained + len(handed), task_stats=task_stats(batch),
            in_flight=len(self.scheduler.running) + len(self.scheduler.landing) + b.held(),
            spanning=sum(1 for t in batch if len(t.versions) > 1),
            trained_turns={tag: (sum(1 for t in batch if t.tag == tag),
                                 sum(len(t.all_turns) for t in batch if t.tag == tag))
                           for tag in sorted({t.tag for t in batch})},
        )
        rec.staleness = dict(Counter(paper_staleness(rec, t) for t in batch))
        if b.filter_zero_variance:
            rec.filtered_groups, rec.zero_variance_kept = b.last_filter
        if early is not None:  # the weight update that swapped in while the batch formed
            self.weights.carry_over(early, rec)
        self.records.append(rec)
        self.trained_by_tag.update(t.tag for t in batch)
        self.trained_by_tag_at[step + 1] = Counter(self.trained_by_tag)
        for old in [k for k in self.trained_by_tag_at if k < step - 2 * KEEP_BATCHES]:
            del self.trained_by_tag_at[old]  # periodic checkpoints read recent steps only
        return rec

    def report_trained(self, version: int) -> int:
        """Write the metrics line of every step the trainer finished (its ``version``)
        that was not reported yet: a run interrupted between a train step and its report
        still has a line for it (``train/interrupted`` 1: the step's train metrics were
        lost with the call). Returns the lines written."""
        # Its batch was counted dropped when the run stopped (the call was lost): the
        # trainer did train it, so it counts as trained after all.
        for step in [s for s in self._dropped_untrained if s < version]:
            self.buffer.redeem_untrained(self._dropped_untrained.pop(step), "run_end")
        late = [r for r in self.records if r.step < version and r.step >= self._reported]
        for rec in late:
            if not rec.train_metrics:
                rec.train_metrics = {"interrupted": 1.0}
            self._report(rec)
        return len(late)

    def _report(self, rec: StepRecord) -> None:
        self._reported = max(self._reported, rec.step + 1)
        i = rec.step - self.first_step
        prev = self.records[i - 1] if i > 0 else self.session_start
        metrics = step_metrics(rec, prev, self.buffer, self.wall_s())
        metrics.update(self.scheduler.env_metrics())
        # Accounting at the batch's formation: launched = trained + dropped + in flight
        # (running, or finished and not yet trained or counted).
        metrics["trajectories/launched"] = rec.launched
        metrics["trajectories/in_flight"] = rec.in_flight
        metrics["trajectories/retried"] = self.scheduler.retried
        if self.on_step is not None:
            self.on_step(rec, metrics)
        old = len(self.records) - 1 - KEEP_BATCHES
        if old >= 0:
            self.records[old].batch = []


def run_watchdog(config: RunConfig) -> Watchdog:
    """The run's watchdog by its ``rollout`` keys (the stall limit until the first progress:
    :func:`first_episode_s`)."""
    r = config.rollout
    return Watchdog([t.tag for t in config.tasks], r.drop_window, r.max_drop_rate,
                    r.stall_timeout_s, first_progress_s=first_episode_s(config))


def first_episode_s(config: RunConfig) -> float:
    """The longest a task's first episode may take by its timeouts: reset, each turn's
    generate and env step, the reward (the watchdog's stall limit until first progress)."""
    return max(t.reset_timeout_s + t.max_turns * (t.generate_timeout_s + t.step_timeout_s)
               + t.reward_timeout_s for t in config.tasks)


def task_stats(batch: list[Trajectory]) -> dict[str, dict[str, float | None]]:
    """Per task: mean reward and success rate of a batch (for the learning summary)."""
    out: dict[str, dict[str, float | None]] = {}
    for tag in sorted({t.tag for t in batch}):
        trajs = [t for t in batch if t.tag == tag]
        succ = [1.0 if t.info["success"] else 0.0 for t in trajs if "success" in t.info]
        out[tag] = {"reward": sum(t.reward or 0.0 for t in trajs) / len(trajs),
                    "success": sum(succ) / len(succ) if succ else None,
                    "n": float(len(trajs)), "n_success": float(len(succ))}
    return out


def task_quota(config: RunConfig) -> dict[str, int]:
    """Trajectories of each task in a batch: whole groups, by sampling weight (largest
    remainder). Every task gets at least one group."""
    r = config.rollout
    groups = r.batch_size // r.group_size
    tasks = config.tasks
    if groups < len(tasks):
        raise ValueError(
            f"rollout.batch_size {r.batch_size} holds {groups} group(s) of {r.group_size}, "
            f"fewer than the {len(tasks)} tasks; raise batch_size to at least "
            f"{len(tasks) * r.group_size}"
        )
    total = sum(t.weight for t in tasks)
    exact = {t.tag: 1 + (groups - len(tasks)) * t.weight / total for t in tasks}
    alloc = {tag: int(x) for tag, x in exact.items()}
    left = groups - sum(alloc.values())
    for tag in sorted(exact, key=lambda k: exact[k] - alloc[k], reverse=True)[:left]:
        alloc[tag] += 1
    return {tag: n * r.group_size for tag, n in alloc.items()}


def launches_per_step(config: RunConfig) -> dict[str, int]:
    """Trajectories launched per iteration in sync / one_off (and the environments async
    keeps busy): each task's share of a batch plus ``redundancy``, in whole groups."""
    r = config.rollout
    return {
        tag: math.ceil(n * (1 + r.redundancy) / r.group_size) * r.group_size
        for tag, n in task_quota(config).items()
    }

