"""Staging a weight update inside an engine worker: receive in the background, swap at once.

ROLLART hides the cost of weight sync by pulling the next version's buckets while rollout
continues and only swapping them in at the protocol's suspend point. :class:`WeightStager`
is that mechanism, engine- and transport-agnostic: any ``WeightTransport`` (its blocking
``fetch`` runs in a background thread; a transport with ``receive_on_loop(manifest)``,
which returns the buckets or an awaitable of them, is received on the engine worker's
event loop instead, which a run on virtual time can sleep: the simulator's) and any ``InferenceEngine`` (only ``version`` and
``load_weights`` are used).

Error policy (one choice, used everywhere): ``commit`` RAISES :class:`WeightSyncError`
carrying the version and the reason, and never calls ``load_weights`` with an incomplete,
corrupt or mixed set of buckets. An engine that saw the error is still on its old version
and keeps serving; the training protocol does not catch it: the run stops, after its final
checkpoint and summary are written (``rollart_sdk.job.run_job``).

Timing: ``transfer_s`` is how long the background receive took; ``exposed_s`` is what the
suspend point costs: waiting for whatever of the receive is still outstanding plus the
engine's ``load_weights``. With enough rollout time between ``start`` and ``commit``,
``exposed_s`` is close to the swap alone.

The collective path (:mod:`rollart_sdk.weights.direct`): constructed with ``engine=`` an
engine whose own workers can receive (``EngineReceiver``: vLLM, SGLang) and given a
transport that offers it (``receiver_spec``: ``nccl``), a version is received by the
engine's workers instead of this process: ``start`` asks them to stage it, readiness is
their status, ``commit`` calls ``engine.commit_direct``. Same protocol, same errors; any
other pair (a transport that stages to a store, an engine without it) keeps the bytes path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollart_sdk.interfaces import WeightTransport
from rollart_sdk.types import WeightBucket, WeightManifest, WeightUpdateReport
from rollart_sdk.weights.buckets import WeightSyncError, check_complete
from rollart_sdk.weights.direct import direct_spec, remote_error

POLL_S = 0.05  # how often the collective path asks the engine's workers for their status

__all__ = ["WeightLoader", "WeightStager", "WeightSyncError"]


@runtime_checkable
class WeightLoader(Protocol):
    """The part of :class:`rollart_sdk.interfaces.InferenceEngine` the stager uses."""

    @property
    def version(self) -> int: ...

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int: ...


class _Superseded(Exception):
    """A newer ``start`` (or ``cancel``) made this transfer pointless."""


@dataclass
class _Transfer:
    manifest: WeightManifest
    future: concurrent.futures.Future[list[WeightBucket]] = field(
        default_factory=concurrent.futures.Future
    )
    cancelled: threading.Event = field(default_factory=threading.Event)
    transfer_s: float = 0.0
    # receive_on_loop: the task receiving on the loop (or the buckets, already there)
    task: asyncio.Future[list[WeightBucket]] | None = None
    direct: bool = False  # received by the engine's own workers (the collective path)
    # the collective path's task (it settles ``future``: done/error/received read that)
    direct_task: Any = None

    def done(self) -> bool:
        return self.task.done() if self.task is not None else self.future.done()

    def error(self) -> BaseException | None:
        """Why the finished transfer failed (None: it arrived, or it is still running)."""
        if not self.done():
            return None
        if self.task is not None:
            if self.task.cancelled():
                return WeightSyncError(self.manifest.version, "superseded by a newer start()")
            return self.task.exception()
        return self.future.exception()

    def received(self) -> asyncio.Future[list[WeightBucket]]:
        """The buckets, to await on the running loop."""
        if self.task is not None:
            return self.task
        received = asyncio.wrap_future(self.future)
        # Marks a late failure as seen (no "exception never retrieved" noise).
        received.add_done_callback(lambda f: f.cancelled() or f.exception())
        return received

    def stop(self) -> None:
        self.cancelled.set()
        if self.task is not None:
            self.task.cancel()


class WeightStager:
    """Receives the next policy version in the background and swaps it in on ``commit``.

    One per engine worker. ``start(manifest)`` as soon as a manifest is known (rollout
    keeps running); ``await commit(engine)`` at the suspend point. A newer ``start``
    supersedes an older transfer, finished or not (its buckets are dropped).
    """

    def __init__(self, transport: WeightTransport, *, name: str = "weight-stager",
                 engine: Any = None) -> None:
        self.transport = transport
        self.engine = engine  # an EngineReceiver takes the collective path (module doc)
        self.name = name
        self._transfer: _Transfer | None = None
        self._lock = threading.Lock()

    @property
    def staged_version(self) -> int | None:
        """The version being received (or received and not yet committed), if any."""
        t = self._transfer
        return None if t is None else t.manifest.version

    @property
    def ready(self) -> bool:
        """True once the staged version's transfer has finished (successfully or not)."""
        t = self._transfer
        return t is not None and t.done()

    def status(self) -> dict[str, Any]:
        """The staged transfer: ``version`` (None: nothing staged), ``ready`` (finished,
        successfully or not), ``error`` (why it failed; None while running or on success)
        and ``transfer_s`` (how long it took, once finished)."""
        t = self._transfer
        if t is None:
            return {"version": None, "ready": False, "error": None, "transfer_s": 0.0}
        exc = t.error()
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        return {"version": t.manifest.version, "ready": t.done(), "error": error,
                "transfer_s": t.transfer_s}

    async def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait until the staged transfer has finished (arrived or failed) without
        committing it; returns :meth:`status` (still ``ready: False`` after a timeout)."""
        t = self._transfer
        if t is not None:
            try:
                await asyncio.wait_for(asyncio.shield(t.received()), timeout_s)
            except asyncio.CancelledError:
                if not _superseded(t):
                    raise
            except TimeoutError:
                pass  # reported as not ready
            except Exception:  # noqa: BLE001 - the failure is reported by status()["error"]
                pass
        return self.status()

    @property
    def direct(self) -> bool:
        """True when the staged version takes the collective path."""
        t = self._transfer
        return t is not None and t.direct

    def start(self, manifest: WeightManifest) -> None:
        """Begin receiving ``manifest``'s buckets in a background thread (or a task on the
        running loop: ``receive_on_loop``; the collective path: a task of the running loop
        that has the engine's workers receive them); returns at once."""
        spec = direct_spec(self.transport, self.engine, manifest)
        loop = None
        if spec is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    "WeightStager.start: the collective path (engine workers receiving "
                    "themselves) needs a running event loop; call start() from a coroutine"
                ) from None
        transfer = _Transfer(manifest, direct=spec is not None)
        with self._lock:
            old, self._transfer = self._transfer, transfer
        if old is not None:
            old.stop()
            if old.direct:
                self._cancel_direct(old.manifest.version)
        if loop is not None and spec is not None:
            transfer.direct_task = loop.create_task(self._receive_direct(transfer, spec))
            return
        receive = getattr(self.transport, "receive_on_loop", None)
        if receive is not None:
            transfer.task = self._on_loop(transfer, receive)
            return
        thread = threading.Thread(
            target=self._receive,
            args=(transfer,),
            name=f"{self.name}-v{manifest.version}",
            daemon=True,
        )
        thread.start()

    def cancel(self) -> None:
        """Drop the staged transfer (the background fetch stops at its next bucket; the
        engine's workers drop what they staged)."""
        with self._lock:
            old, self._transfer = self._transfer, None
        if old is not None:
            old.stop()
            if old.direct:
                self._cancel_direct(old.manifest.version)

    def _cancel_direct(self, version: int) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (closing): the workers' next stage supersedes it anyway
        task = loop.create_task(self.engine.cancel_direct(version))
        task.add_done_callback(lambda f: f.cancelled() or f.exception())

    def take(self) -> list[WeightBucket]:
        """The staged version's buckets once they arrived, without an engine (a worker
        process holding them for the swap); staging is emptied. Raises
        :class:`WeightSyncError` when nothing arrived or the transfer failed."""
        transfer = self._transfer
        if transfer is None or not transfer.done() or transfer.task is not None:
            raise WeightSyncError(-1 if transfer is None else transfer.manifest.version,
                                  "nothing has arrived to take")
        self._clear(transfer)
        return transfer.future.result()


    close = cancel

    async def commit(
        self, engine: WeightLoader, timeout_s: float | None = None
    ) -> WeightUpdateReport:
        """Wait for the staged transfer, then ``await engine.load_weights(buckets, version)``.

        Raises :class:`WeightSyncError` (engine untouched) when nothing is staged, the
        transfer failed, it is older than the engine's version, or it did not finish
        within ``timeout_s`` (then it stays staged and a later ``commit`` may succeed).
        A ``start`` that lands while ``commit`` waits supersedes the awaited transfer, so
        that ``commit`` raises too; the next ``commit`` takes the newer version.
        """
        t0 = time.perf_counter()
        transfer = self._transfer
        if transfer is None:
            raise WeightSyncError(
                engine.version,
                "nothing is staged: call WeightStager.start(manifest) before commit()",
            )
        version = transfer.manifest.version
        received = transfer.received()
        try:
            if timeout_s is None and transfer.task is not None:
                buckets = await received  # a task on this loop: nothing to shield it from
            else:  # the shield keeps a commit timeout from cancelling the transfer itself
                buckets = await asyncio.wait_for(asyncio.shield(received), timeout_s)
        except asyncio.CancelledError:
            if not _superseded(transfer):
                raise  # this commit was cancelled, not the transfer
            self._clear(transfer)
            raise WeightSyncError(version, "superseded by a newer start()") from None
        except TimeoutError:
            raise WeightSyncError(
                version,
                f"the transfer did not finish within {timeout_s}s; the engine stays on "
                f"version {engine.version} (the transfer stays staged)",
            ) from None
        except WeightSyncError:
            self._clear(transfer)
            raise
        except Exception as exc:
            self._clear(transfer)
            raise WeightSyncError(
                version,
                f"transport fetch failed with {type(exc).__name__}: {exc}; the engine "
                f"stays on version {engine.version}",
            ) from exc
        self._clear(transfer)
        if version < engine.version:
            if transfer.direct:
                self._cancel_direct(version)
            raise WeightSyncError(
                version,
                f"it is older than the engine's version {engine.version}; refusing to go back",
            )
        swap = "commit_direct" if transfer.direct else "load_weights"
        try:
            if transfer.direct:
                recomputed = await self.engine.commit_direct(version)
            else:
                recomputed = await engine.load_weights(buckets, version)
        except Exception as exc:
            raise WeightSyncError(
                version,
                f"engine.{swap} raised {type(exc).__name__}: {exc} (every bucket had "
                f"arrived verified; the engine reports version {engine.version})",
            ) from exc
        exposed = time.perf_counter() - t0
        return WeightUpdateReport(
            version=version,
            transfer_s=transfer.transfer_s,
            exposed_s=exposed,
            nbytes=transfer.manifest.nbytes if transfer.direct else sum(
                b.nbytes for b in buckets),
            recomputed_requests=int(recomputed or 0),
            direct=transfer.direct,
        )

    # -- internals -------------------------------------------------------------------
    def _clear(self, transfer: _Transfer) -> None:
        with self._lock:
            if self._transfer is transfer:
                self._transfer = None

    def _on_loop(self, transfer: _Transfer, receive: Any) -> asyncio.Future[list[WeightBucket]]:
        """``transport.receive_on_loop(manifest)``: buckets there at once (a done future:
        the transfer is ready now), or an awaitable received by a task on the loop."""
        loop = asyncio.get_running_loop()
        got = receive(transfer.manifest)
        if inspect.isawaitable(got):
            task = loop.create_task(self._receive_on_loop(transfer, got),
                                    name=f"{self.name}-v{transfer.manifest.version}")
            task.add_done_callback(lambda f: f.cancelled() or f.exception())
            return task
        done: asyncio.Future[list[WeightBucket]] = loop.create_future()
        try:
            buckets = list(got)
            check_complete(transfer.manifest, buckets)
            done.set_result(buckets)
        except Exception as exc:  # noqa: BLE001 - handed to commit() via the future
            done.set_exception(exc)
            done.exception()  # seen: status() and commit() report it
        return done

    @staticmethod
    async def _receive_on_loop(transfer: _Transfer,
                               got: Awaitable[Iterable[WeightBucket]]) -> list[WeightBucket]:
        """Task body: await the transport's receive, then check it is complete;
        ``transfer_s`` on the loop's clock (virtual on a simulated run)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            buckets = list(await got)
            check_complete(transfer.manifest, buckets)
        finally:
            transfer.transfer_s = loop.time() - t0
        return buckets

    async def _receive_direct(self, transfer: _Transfer, spec: dict[str, Any]) -> None:
        """Task body (the collective path): the engine's workers stage the version; done
        when every worker reports it arrived (or one failed)."""
        t0 = time.perf_counter()
        version = transfer.manifest.version
        try:
            await self.engine.stage_direct(transfer.manifest, spec)
            while True:
                if transfer.cancelled.is_set():
                    raise _Superseded()
                status = await self.engine.direct_status()
                if status["version"] != version:
                    raise WeightSyncError(version, "the engine's workers stage version "
                                                   f"{status['version']} instead")
                if status["ready"]:
                    break
                await asyncio.sleep(POLL_S)
            if status["error"]:
                raise remote_error(version, status["error"])
        except BaseException as exc:  # noqa: BLE001 - handed to commit() via the future
            transfer.transfer_s = time.perf_counter() - t0
            if isinstance(exc, _Superseded | asyncio.CancelledError):
                exc = WeightSyncError(version, "superseded by a newer start()")
            transfer.future.set_exception(exc)
            return
        transfer.transfer_s = time.perf_counter() - t0
        transfer.future.set_result([])

    def _receive(self, transfer: _Transfer) -> None:
        """Thread body: drain ``transport.fetch`` into a list, then check it is complete."""
        t0 = time.perf_counter()
        buckets: list[WeightBucket] = []
        try:
            stream = self.transport.fetch(transfer.manifest)
            try:
                for bucket in stream:
                    if transfer.cancelled.is_set():
                        raise _Superseded()
                    buckets.append(bucket)
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            if transfer.cancelled.is_set():
                raise _Superseded()
            check_complete(transfer.manifest, buckets)
        except BaseException as exc:  # noqa: BLE001 - handed to commit() via the future
            transfer.transfer_s = time.perf_counter() - t0
            if isinstance(exc, _Superseded):
                exc = WeightSyncError(
                    transfer.manifest.version, "superseded by a newer start()"
                )
            transfer.future.set_exception(exc)
            return
        transfer.transfer_s = time.perf_counter() - t0
        transfer.future.set_result(buckets)


def _superseded(transfer: _Transfer) -> bool:
    """The transfer's task was cancelled (a newer ``start``, or ``cancel``) and the
    current task is not being cancelled itself."""
    task = asyncio.current_task()
    return (transfer.task is not None and transfer.task.cancelled()
            and not (task is not None and task.cancelling()))
