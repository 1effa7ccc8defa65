"""Weight updates at the protocol's suspend points (steps 2-5), for the Pipeline.

After each train step the trainer publishes version ``v`` and every engine starts
receiving it in the background (``WeightSync.stage``). At a suspend point the staged
version is swapped in (suspend, commit on every engine, resume); what the rollout waited
for is the update's *exposed* time (docs/benchmarks.md, "Weight sync").

Deferral (async mode, ``rollout.defer_weight_update``: ``auto`` by default, ``true``,
``false``). When the next suspend point follows ``publish`` at once (the usual case: the next batch is complete when
a training step ends), the background receive has had no time to overlap anything, and
swapping there would expose the whole transfer. Instead, a version that has not fully
arrived on every engine is not waited for: the engines keep generating on their version
and the swap comes at a later suspend point, as long as

- the staged version is the newest published one: at most one version is in flight per
  engine (a newer published one is staged once this one is committed), so no transport
  holds more than the version served, the one staged and the one just published; and
- the staleness bound allows it: every batch takes only trajectories started at
  ``>= trainer version - 1 - alpha`` (``batch_floor``: the engines' version at
  ``get_batch`` were every suspend point to swap, minus alpha), so the engines may stay
  on version ``e`` through training step ``t`` only while ``e >= t - alpha``.

Deferring trains the next batch one version further behind the weights, so ``auto``
defers only a transfer that took at least ``DEFER_MIN_SHARE`` of the last training step
(:meth:`WeightUpdates._worth_deferring`). Otherwise the update waits for the transfer
(the rollout goes on meanwhile: nothing is suspended until it has arrived) and the wait
counts as exposed. With alpha = 1, when it defers, the steady state is: at suspend point ``t`` version ``t - 1`` (received during training step
``t - 1``) is swapped in and version ``t`` starts arriving; the engines serve ``t - 1``
through training step ``t``. alpha = 0 never defers.

A staged version that failed to arrive on any engine (a peer killed, a store key removed,
a corrupt bucket) is dropped on all of them before anything is swapped in: every engine
keeps the version it serves and the run goes on, with the newest published version staged
next (whatever ``auto`` would choose for a healthy transfer: after a failure, keeping
the engines' version is the only way on); when the bound does not allow going on without
a newer version, that one is waited for, and the run stops with the reason only if it
fails too (or none was published yet).

An engine counted in the round of the staged version dies before that round completed
(``on_death``, from the LLMProxy): a push transport's round (``nccl``) would wait for it
(``join_timeout_s``) and fail. So the round is re-formed for the survivors at once, not
waited out: every live engine is staged the same version again, marked
(:func:`~rollart_sdk.weights.sync.for_reform`: the transport cancels the round in flight
and each survivor receives the version alone), by whoever holds the weight-update lock
(an update waiting for the transfer notices the death and re-forms before it waits on;
else a task as soon as the lock is free, before the dead engine's reload). The commit
stays all-or-nothing over the survivors; the dead engine loads the served version when it
is back (control/recovery.py). Pull transports have no round: nothing is re-staged.

It calls down only: the trainer's client (``release_weights`` once every engine moved past
a version) and the run's :class:`~rollart_sdk.control.events.RolloutEvents` (``room``: the
engines' version changed or an update was held back, which admission control counts
from; the scheduler's launch loop awaits it).

The first update of a run is the baseline: received only at its suspend point, so that
its pull + swap + KV recompute run with nothing overlapping; every later update's
``hidden_fraction`` is measured against it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollart_sdk.control.events import RolloutEvents
from rollart_sdk.control.versions import PolicyVersions
from rollart_sdk.control.watchdog import RunFailure
from rollart_sdk.types import WeightManifest, WeightUpdateReport
from rollart_sdk.weights.sync import WeightSync, for_reform

if TYPE_CHECKING:
    from rollart_sdk.cluster.handles import TrainerClient
    from rollart_sdk.control.proxy import LLMProxy
    from rollart_sdk.control.records import StepRecord

KEEP_MANIFESTS = 3  # versions whose manifests are kept (served, staged, just published)
# defer_weight_update "auto": defer a transfer that took at least this share of a step.
DEFER_MIN_SHARE = 0.1
# Re-forms one wait for a transfer goes through before it waits without watching deaths.
MAX_REFORMS = 16
# The step record's fields an update fills (``update``; ``carry_over`` moves them).
UPDATE_FIELDS = ("weight_sync_exposed_s", "weight_transfer_s", "weight_recompute_s",
                 "weight_sync_baseline_s", "weight_sync_nbytes", "weight_sync_wait_s",
                 "weight_deferred", "weight_sync_failed", "recomputed", "weight_sync_direct")


class WeightUpdates:
    """The pipeline's weight-sync state: published, staged and served versions."""

    def __init__(self, weight_sync: WeightSync, proxy: LLMProxy, versions: PolicyVersions,
                 *, mode: str, alpha: int, defer: bool | str, log: list[str],
                 emit: Callable[[dict[str, Any]], None],
                 trainer: TrainerClient | None = None,
                 events: RolloutEvents | None = None) -> None:
        self.sync = weight_sync
        self.proxy = proxy
        self.versions = versions
        self.mode = mode
        self.alpha = alpha
        self.defer = bool(defer) and mode == "async"
        # "auto": defer only a transfer that is slow next to a training step (below).
        self.defer_auto = defer == "auto"
        self.last_train_s: float | None = None  # the pipeline's latest train step
        self.last_transfer_s: float | None = None  # the latest swap's slowest transfer
        self.log = log
        self._emit = emit
        # The trainer (rank 0) drops a version every engine moved past (None: unit tests).
        self.trainer = trainer
        # Admission control counts from the engines' version: a change makes room.
        self.events = events if events is not None else RolloutEvents()
        # Weight updates and an engine's reload after a restart never interleave.
        self.lock = asyncio.Lock()
        self.manifests: dict[int, WeightManifest] = {}  # version -> manifest (the last few)
        self.published: int | None = None  # newest version published
        # The version every engine is receiving or holds received, not committed (at most
        # one: a newer published version is staged once this one is committed).
        self.staged: int | None = None
        self.reports: list[WeightUpdateReport] = []
        self.failures: list[tuple[int, str]] = []  # (version, why) of dropped transfers
        self.baseline_s: float | None = None
        self._unstaged: WeightManifest | None = None  # kept back for the baseline update
        self._baseline_taken = False  # the baseline update happened (its figure may follow)
        self._baseline_rec: StepRecord | None = None
        self._recompute_mark: dict[str, float] = {}  # engine -> its recompute_s after a swap
        # The engines counted in the staged version's round (None: no round to re-form:
        # nothing staged, or already re-formed), and a death to look at (on_death).
        self._round: set[str] | None = None
        self._died = asyncio.Event()
        self._reformer: asyncio.Future[None] | None = None
        self._push: dict[str, bool] = {}  # transport name -> its style is "push"
        self.reforms: list[tuple[int, list[str]]] = []  # (version, engines left out)
        if proxy is not None:  # (unit tests drive it without one)
            proxy.on_worker_death.append(self.on_death)

    def carry_over(self, early: StepRecord, rec: StepRecord) -> None:
        """An update ran before its step's record existed (inside the wait for the batch,
        ``Pipeline._next_batch``, given a provisional record ``early`` to fill): its figures
        go into ``rec``."""
        for name in UPDATE_FIELDS:
            setattr(rec, name, getattr(early, name))
        if self._baseline_rec is early:
            self._baseline_rec = rec

    # ------------------------------------------------------------------ versions
    @property
    def engine(self) -> int:
        return self.versions.engine

    def batch_floor(self, step: int) -> int:
        """Oldest start version batch ``step`` may take (the staleness bound). Async: the
        version the engines serve at ``get_batch`` when every suspend point swaps after
        its batch (``step - 1``) minus alpha, so that a deferred swap never loosens the
        bound: batch ``step``, trained at version ``step``, takes trajectories started at
        most ``alpha + 1`` versions before. (A swap inside the wait for the batch,
        ``Pipeline._next_batch``, leaves it there: it freshens what starts after it.)"""
        if self.mode == "async":
            return max(step - 1, 0) - self.alpha
        return self.engine - self.alpha

    def staged_manifest(self) -> WeightManifest | None:
        """The version being received, not committed (a restarted engine receives it too)."""
        if self.staged is None or self.staged <= self.engine:
            return None
        return self.manifests.get(self.staged)

    def served_manifest(self) -> WeightManifest | None:
        return self.manifests.get(self.engine)

    # ------------------------------------------------------------------ publish
    async def on_publish(self, manifest: WeightManifest) -> None:
        """The trainer published ``manifest``: engines start receiving it unless another
        version is in flight (then it is staged once that one is committed)."""
        async with self.lock:  # a restarted engine reloading sees this version too
            self.manifests[manifest.version] = manifest
            for v in sorted(self.manifests)[:-KEEP_MANIFESTS]:
                if v not in (self.engine, self.staged):
                    del self.manifests[v]
            self.published = manifest.version
            if not self._baseline_taken:
                self._unstaged = manifest  # received at the suspend point: the baseline
            elif self.staged is None:
                await self._stage(manifest)

    async def _stage(self, manifest: WeightManifest) -> None:
        self._round = {w.name for w in self.sync.live()}  # counted in meta["receivers"]
        await self.sync.stage(manifest)
        self.staged = manifest.version

    # ------------------------------------------------------------------ deaths
    def on_death(self, name: str, why: str) -> None:
        """An engine died (LLMProxy.mark_down): re-form the staged round without it as
        soon as the weight-update lock allows (an update waiting holds it: it re-forms)."""
        self._died.set()
        if self._reformer is None or self._reformer.done():
            self._reformer = asyncio.ensure_future(self._reform_when_free())

    async def close(self) -> None:
        """The run ended: a re-form still waiting for the lock is not needed any more."""
        if self._reformer is not None and not self._reformer.done():
            self._reformer.cancel()
            await asyncio.gather(self._reformer, return_exceptions=True)

    async def _reform_when_free(self) -> None:
        async with self.lock:
            await self._reform()

    async def _reform(self) -> None:
        """Stage the staged version again on the live engines, alone each, when an engine
        counted in its round is down (module docstring); else nothing."""
        self._died.clear()
        if self.staged is None or self._round is None or self.staged <= self.engine:
            return
        live = {w.name for w in self.sync.live()}
        gone = sorted(self._round - live)
        manifest = self.manifests.get(self.staged)
        if not gone or manifest is None or not self._is_push(manifest.transport):
            return
        statuses = await self.sync.status()
        if any(s.get("ready") and not s.get("error") and s.get("version") == self.staged
               for s in statuses):  # the round completed before the death: nothing waits
            self._round = None
            return
        self._round = None  # each survivor receives it alone: no round left to re-form
        self.reforms.append((self.staged, gone))
        self.log.append(f"reform:{self.staged}")
        now = time.time()
        self._emit({"trajectory": None, "tag": None, "span": "weight_sync_reformed",
                    "worker": None, "t0": now, "t1": now, "version": self.staged,
                    "left_out": gone, "receivers": sorted(live)})
        await self.sync.stage(for_reform(manifest))

    def _is_push(self, transport: str) -> bool:
        """The transport's style is "push" (its receivers meet in rounds); unknown: True
        (re-staging a pull transport's version only fetches it once more)."""
        if transport not in self._push:
            try:
                from rollart_sdk.plugins import get_registry

                factory = get_registry().get("transport", transport).load()
                self._push[transport] = getattr(factory, "style", "push") == "push"
            except Exception:  # noqa: BLE001 - not registered (a test's own): assume push
                self._push[transport] = True
        return self._push[transport]

    async def _wait_ready(self) -> list[dict[str, Any]]:
        """``sync.wait_ready()``, re-forming the round at once when an engine dies while
        it waits (the wait on the old round then ends: superseded) and waiting again."""
        for _ in range(MAX_REFORMS):
            await self._reform()
            waiting = asyncio.ensure_future(self.sync.wait_ready())
            died = asyncio.ensure_future(self._died.wait())
            await asyncio.wait({waiting, died}, return_when=asyncio.FIRST_COMPLETED)
            died.cancel()
            if not self._died.is_set():
                return await waiting
            await self._reform()
            await waiting  # the transfers it waited for were superseded (or ended)
        return await self.sync.wait_ready()

    # ------------------------------------------------------------------ suspend point
    async def update(self, rec: StepRecord | None) -> None:
        """Protocol steps 2-5 at a suspend point (see the module docstring)."""
        if self.published is None or self.published == self.engine:
            return
        async with self.lock:
            if not self._baseline_taken:
                await self._swap(rec)
            else:
                await self._update(rec)
            if (self.staged is None and self.published > self.engine
                    and self.published in self.manifests and not self._failed(self.published)):
                await self._stage(self.manifests[self.published])
            held = self.published > self.engine
            if held != self.versions.held_back:
                self.versions.held_back = held
                self.events.room()  # admission control counts one version more (or less) now
            if self.published > self.engine:  # the engines go on generating on theirs
                self.log.append(f"defer:{self.published}")
                if rec is not None:
                    rec.weight_deferred = self.published

    def _failed(self, version: int) -> bool:
        return any(v == version for v, _ in self.failures)

    def _may_defer(self) -> bool:
        """Deferring is allowed (the bound) and chosen (``defer_weight_update``)."""
        return self.defer and self._bound_allows() and self._worth_deferring()

    def _bound_allows(self) -> bool:
        """The engines' version still satisfies the next batch's floor. After a failed
        transfer this alone decides: keeping the engines' version is then the only way
        on, whatever ``defer_weight_update: auto`` would choose for a healthy one."""
        return self.mode == "async" and self.engine >= self.versions.trainer - self.alpha

    def _worth_deferring(self) -> bool:
        """``defer_weight_update: auto``: deferring hides the transfer but trains every
        later batch one version further behind the weights (the engines serve ``t - 1``
        through training step ``t``); worth it only when waiting would expose a real
        share of a step: the last transfer took at least ``DEFER_MIN_SHARE`` of the last
        training step (an in-memory copy of a small model takes milliseconds). Unknown
        yet (no transfer or step measured): defer."""
        if not self.defer_auto or self.last_transfer_s is None or self.last_train_s is None:
            return True
        return self.last_transfer_s >= DEFER_MIN_SHARE * self.last_train_s

    async def _update(self, rec: StepRecord | None) -> None:
        assert self.published is not None
        await self._reform()  # an engine died since the version was staged
        if self.staged is None:
            if self._failed(self.published):  # dropped: the next published one comes next
                if self._bound_allows():
                    return
                raise RunFailure(self._stuck(self.published, self.failures[-1][1]))
            await self._stage(self.manifests[self.published])
        statuses = await self.sync.status()
        ready = all(s["ready"] for s in statuses)
        if not ready and self.staged == self.published and self._may_defer():
            return  # swapped at a later suspend point
        wait_s = 0.0
        if not ready:
            t0 = time.perf_counter()
            statuses = await self._wait_ready()
            wait_s = time.perf_counter() - t0
        failed, why = self._check(statuses)
        if failed is None:
            await self._swap(rec, wait_s)
            return
        await self._drop(failed, why, rec)
        if self._may_defer():
            return  # the engines keep their version; the newest published one comes next
        newer = self.published if self.published > failed else None
        if newer is not None and newer in self.manifests:
            await self._stage(self.manifests[newer])
            t0 = time.perf_counter()
            statuses = await self._wait_ready()
            wait_s += time.perf_counter() - t0
            failed, why = self._check(statuses)
            if failed is None:
                await self._swap(rec, wait_s)
                return
            await self._drop(failed, why, rec)
        if self._bound_allows():
            return  # no newer version yet: the engines keep theirs until one arrives
        raise RunFailure(self._stuck(failed, why))

    def _stuck(self, failed: int, why: str) -> str:
        return (f"weight version {failed} did not arrive on every engine ({why}); every "
                f"engine still serves version {self.engine}, and the staleness bound "
                f"(rollout.alpha={self.alpha}) does not allow training step "
                f"{self.versions.trainer} to go on without a newer one. Check the transport "
                "(its store, its peers) and resume from the last checkpoint")

    def _check(self, statuses: list[dict[str, Any]]) -> tuple[int | None, str]:
        """(staged version, why) when it did not arrive on some engine, else (None, "")."""
        bad = [s for s in statuses if s.get("error") or not s.get("ready")
               or s.get("version") != self.staged]
        if not bad:
            return None, ""
        why = "; ".join(f"{s.get('name')}: {self._why(s)}" for s in bad)
        return self.staged, why[:1000]

    def _why(self, status: dict[str, Any]) -> str:
        if status.get("error"):
            return str(status["error"])
        if status.get("version") != self.staged:
            return f"holds version {status.get('version')}, not the staged {self.staged}"
        return "still receiving"

    async def _drop(self, version: int, why: str, rec: StepRecord | None) -> None:
        """Every engine drops the staged ``version`` and keeps serving its own."""
        await self.sync.cancel()
        self.staged = None
        self.failures.append((version, why))
        self.log.append(f"failed:{version}")
        now = time.time()
        self._emit({"trajectory": None, "tag": None, "span": "weight_sync_failed",
                    "worker": None, "t0": now, "t1": now, "version": version, "error": why})
        if rec is not None:
            rec.weight_sync_failed = version

    async def _swap(self, rec: StepRecord | None, wait_s: float = 0.0) -> None:
        """Suspend, commit the staged version on every engine, resume (and the timing)."""
        self.log.append("suspend")
        t0 = time.perf_counter()
        baseline: float | None = None
        try:
            # Inside the try: a stop (the run's task cancelled) landing while the engines
            # are asked to suspend still resumes them. Left suspended, the proxy held every
            # request back and the run's stop waited its 60 s on episodes that could not
            # end (a SIGTERM at step 1 took more than 45 s in CI).
            await self.proxy.suspend()
            t_suspended = time.perf_counter()
            if self._unstaged is not None:  # the baseline update: nothing overlaps the pull
                manifest, self._unstaged = self._unstaged, None
                await self._stage(manifest)
            self.log.append(f"update:{self.staged}")
            target = self.staged
            # Engines marked down (or dying now) are left out: each loads this version
            # before it serves again (control/recovery.py).
            reports: list[WeightUpdateReport] = await self.sync.commit()
            self.staged = None
            if not self._baseline_taken:
                baseline = time.perf_counter() - t_suspended
                self._baseline_taken = True
            self._recompute_mark = await self._recompute_s()
        finally:
            await self.proxy.resume()
            self.log.append("resume")
        # Exposed: the whole window the rollout waited, from asking the engines to stop
        # (they finish their running step) to admitting again, plus a wait for the
        # transfer that the staleness bound forced; the KV recompute the swap causes is
        # added when the step is reported (settle).
        window = time.perf_counter() - t0 + wait_s
        released = self.engine
        # No report: every engine was down; each loads this version when it is back.
        versions = ({r.version for r in reports} if reports
                    else {target} if target is not None else set())
        if len(versions) != 1:
            raise RunFailure(f"the engines committed different versions {sorted(versions)}")
        self.versions.engine = versions.pop()
        if reports:
            self.last_transfer_s = max(r.transfer_s for r in reports)
        self.events.room()
        self.reports.extend(reports)
        t0_wall = time.time() - (time.perf_counter() - t0)
        for w in self.sync.live():  # the engines that swapped (a down one reloads later)
            self._emit({"trajectory": None, "tag": None, "span": "weight_sync",
                        "worker": w.name, "step": self.versions.trainer, "t0": t0_wall,
                        "t1": time.time(), "version": self.versions.engine})
        if released and self.trainer is not None:  # every engine committed a newer one
            await self.trainer.release_weights(released)  # the trainer may drop it
        if rec is not None:
            rec.weight_sync_exposed_s = window
            rec.weight_sync_wait_s = wait_s
            rec.weight_transfer_s = max((r.transfer_s for r in reports), default=0.0)
            rec.weight_sync_nbytes = max((r.nbytes for r in reports), default=0)
            rec.recomputed = sum(r.recomputed_requests for r in reports)
            rec.weight_sync_direct = sum(1 for r in reports if r.direct)
            if baseline is not None:
                rec.weight_sync_baseline_s = baseline  # recompute added at report time
                self._baseline_rec = rec
        elif baseline is not None:
            self.baseline_s = baseline

    async def _recompute_s(self) -> dict[str, float]:
        """Each engine's cumulative KV-recompute seconds (engines that report them)."""
        stats = await self.sync.stats()
        return {str(s.get("name")): float(s.get("recompute_s", 0.0)) for s in stats}

    async def settle(self, rec: StepRecord) -> None:
        """Add the KV recompute the step's update caused (done by now: the engines ran a
        whole training step since) to its exposed time, and to the baseline's."""
        if rec.weight_sync_exposed_s == 0.0:  # no update in this step
            return
        if self._recompute_mark:
            now = await self._recompute_s()
            rec.weight_recompute_s = max(
                (now.get(k, v) - v for k, v in self._recompute_mark.items()), default=0.0)
            rec.weight_sync_exposed_s += rec.weight_recompute_s
            self._recompute_mark = {}
        if rec is self._baseline_rec and rec.weight_sync_baseline_s is not None:
            rec.weight_sync_baseline_s += rec.weight_recompute_s
            self.baseline_s = rec.weight_sync_baseline_s
        rec.weight_sync_baseline_s = self.baseline_s
