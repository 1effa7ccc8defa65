"""The four role workers that host plugin backends: ActorGen, ActorTrain, Environment, Reward.

Each subclasses its role's :class:`~rollart_sdk.cluster.worker.Worker` base, so a
:class:`~rollart_sdk.cluster.Cluster` runs it as Ray actors on the pools the resource plan
bound (and tests may run it in-process through ``bound_worker_class``). A worker creates
its backend from a registry ``Descriptor`` and validated options, so the backend's heavy
imports happen inside the worker process only.

``EngineWorker.generate`` is ``@hw_mapping``-routed: the Cluster is given the config's task
affinities (``ResourcePlan.hw_affinity()``), and the LLMProxy routes each task's requests to
``cluster.workers_for_tag("generate", tag)``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from rollart_sdk.cluster.envs.process import EnvWorker

# Their former home, re-exported for one release: cluster/envs/results.py
from rollart_sdk.cluster.envs.results import text_observation as text_observation
from rollart_sdk.cluster.shards import Shard, fetch_shard
from rollart_sdk.cluster.worker import (
    ActorGenWorker,
    ActorTrainWorker,
    RewardWorker,
    one_thread,
)
from rollart_sdk.config import ModelConfig
from rollart_sdk.registry import Descriptor
from rollart_sdk.resources.decorators import hw_mapping, register
from rollart_sdk.types import (
    GenerationRequest,
    GenerationResult,
    RewardRequest,
    RewardResult,
    WeightManifest,
    WeightUpdateReport,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from rollart_sdk.cluster.handles import WorkerHandle
    from rollart_sdk.cluster.hosts import (
        EngineHost,
        GeneratedBatch,
        MaybeAwaitable,
        RewardHost,
        TrainerHost,
    )

_MAX_EARLY_ABORTS = 4096


class EngineRestartedError(RuntimeError):
    """This engine worker's process was restarted by Ray and has not reloaded the weights
    every engine serves yet (``reload``): the proxy and WeightSync treat it like a dead
    worker, so EngineRecovery reloads it before it serves again."""


T = TypeVar("T")
HOLD_RESTARTED_ENV = "ROLLART_HOLD_RESTARTED"  # restart_state: rehearse a long restart
EXIT_DELAY_S = 0.5  # a worker whose engine died exits this long after the first error


def _in_ray_actor() -> bool:
    """True in a Ray actor's process (a Ray worker, not the driver)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized()
                    and ray.get_runtime_context().worker.mode == ray.WORKER_MODE)
    except Exception:  # noqa: BLE001 - no Ray runtime here
        return False


def _was_restarted() -> bool:
    """True in a Ray actor whose process is a restart (its ``__init__`` runs again)."""
    import warnings

    ray = sys.modules.get("ray")
    if ray is None:  # a Ray actor's process has imported Ray; an in-process worker need not
        return False
    try:
        with warnings.catch_warnings():  # Ray's property reads its own deprecated actor_id
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.is_initialized()
                        and ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - not a Ray actor (in-process): never restarted
        return False


class EngineWorker(ActorGenWorker):
    """ActorGen: one inference engine + the receiving side of the weight transport."""

    def __init__(self, engine: Descriptor, engine_options: Any, model: ModelConfig,
                 transport: Descriptor, transport_options: Any,
                 threads: int | None = None, offer: dict[str, Any] | None = None) -> None:
        """``offer``: what the backends may take besides their kind's arguments (a
        simulated run's ``sim`` context); they are offered this worker's ``binding`` too
        (``Descriptor.create``)."""
        one_thread(threads, compute=True)
        from collections import OrderedDict

        from rollart_sdk.weights import WeightStager

        self.name = self.worker_name
        offered = {"binding": {"worker": self.name, **(self.binding or {})}, **(offer or {})}
        self.engine = engine.create(engine_options, model=model, offer=offered)
        self.transport = transport.create(transport_options, role="receiver", offer=offered)
        # An engine whose own workers can receive (vllm, sglang) takes a push transport's
        # rounds there (the collective path, rollart_sdk.weights.direct).
        self.stager = WeightStager(self.transport, engine=self.engine)
        self._started: set[str] = set()  # requests handed to the engine, not finished
        # ABORTs that arrived before their request (Ray does not order an async actor's
        # calls): honoured when the request comes; the oldest forgotten past the cap.
        self._early_aborts: OrderedDict[str, None] = OrderedDict()
        self.handoff_errors: dict[str, int] = {}  # PD hand-offs that failed, by error type
        # A restarted process holds the model's initial weights: it serves nothing (and
        # takes part in no weight update) until EngineRecovery called reload().
        self.restarted = _was_restarted()
        self.dead: str | None = None  # why its engine died (then the process exits)
        self.restarts = False  # ... and Ray restarts it (a Ray actor's process)

    async def _engine_call(self, call: Awaitable[T]) -> T:
        """``call`` into the engine backend, its death raised as rollart's
        ``EngineDeadError`` (and this process exiting: :meth:`_exit_if_dead`)."""
        try:
            return await call
        except Exception as exc:
            dead = self._exit_if_dead(exc)
            if dead is None:
                raise
            raise dead from None

    def _exit_if_dead(self, exc: BaseException) -> Exception | None:
        """When the engine backend died inside this worker (:func:`is_engine_dead`): the
        error to raise instead (rollart's ``EngineDeadError``, which every caller can
        unpickle and the proxy reads as a worker death); in a Ray actor the process
        exits shortly after (the callers get the error first) so that Ray restarts it
        and EngineRecovery reloads it. In process nothing restarts it: the proxy takes it
        out of the routes. None for any other error."""
        from rollart_sdk.errors import is_engine_dead

        if not is_engine_dead(exc):
            return None
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        if self.dead is None:
            # From now on this process answers nothing but its death (_serving), so that
            # EngineRecovery waits for the restarted one instead of reloading this one.
            self.dead = why
            self.restarts = _in_ray_actor()
            if self.restarts:
                print(f"engine worker {self.name}: its engine is dead ({why}); exiting this "
                      "process so that Ray restarts it", file=sys.stderr, flush=True)
                asyncio.get_running_loop().call_later(EXIT_DELAY_S, os._exit, 1)
        return self._dead_error()

    def _dead_error(self) -> Exception:
        from rollart_sdk.errors import EngineDeadError, EngineLostError

        cls = EngineDeadError if self.restarts else EngineLostError
        return cls(f"{self.name}: its engine is dead ({self.dead})"
                   + ("" if self.restarts else "; nothing restarts a worker in process"))

    def _serving(self) -> None:
        if self.dead is not None:
            raise self._dead_error()
        if self.restarted:
            raise EngineRestartedError(f"{self.name} was restarted and has not reloaded the "
                                       "weights every engine serves yet")

    @hw_mapping({})  # the table comes from the config: Cluster(hw_affinity=plan.hw_affinity())
    async def generate(self, request: GenerationRequest,
                       kv: list[Any] | None = None) -> GenerationResult:
        """``kv``: with prefill-decode disaggregation, ``[the prefill worker's K/V
        hand-off]`` (a Ray ObjectRef, fetched here from the object store; in-process an
        awaitable). A hand-off that failed is counted and the prompt computed here."""
        self._serving()
        rid = request.request_id
        if self._early_aborts.pop(rid, 0) is None:
            return GenerationResult(rid, [], [], [], "abort", worker=self.name)
        self._started.add(rid)
        failed: BaseException | None = None
        try:
            handoff, failed = await self._handoff(kv) if kv else (None, None)
            if handoff is None:
                result = await self._engine_call(self.engine.generate(request))
            else:
                result = await self._engine_call(self.engine.generate(request, kv=handoff))
        finally:
            self._started.discard(rid)
        result.worker = self.name
        if failed is not None:
            from rollart_sdk.errors import is_worker_death

            result.handoff_error = f"{type(failed).__name__}: {failed}"[:500]
            result.handoff_worker_died = is_worker_death(failed)
        return result

    async def generate_many(self, requests: list[GenerationRequest]
                            ) -> AsyncIterator[GeneratedBatch]:
        """:meth:`generate` of each request, started together (one actor call for many
        turns: the engine gets them at once and batches them in one step); yields
        ``[(index, result or the exception its generate raised), ...]`` for the requests
        that finished at the same time, as they finish. A request whose caller gave up
        is ended by its ABORT (:meth:`abort`), as with :meth:`generate`."""
        pending = {asyncio.ensure_future(self.generate(r)): i for i, r in enumerate(requests)}
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            out: GeneratedBatch = []
            for task in done:
                exc = (RuntimeError(f"{self.name}: generate was cancelled")
                       if task.cancelled() else task.exception())
                out.append((pending.pop(task), exc if exc is not None else task.result()))
            yield sorted(out, key=lambda x: x[0])

    async def _handoff(self, kv: list[Any]) -> tuple[Any, BaseException | None]:
        """(the hand-off, None), or (None, why) when it failed. ``kv[0]``: an ObjectRef
        or an in-process task (awaited), or the hand-off itself (in process)."""
        try:
            return (await kv[0] if inspect.isawaitable(kv[0]) else kv[0]), None
        except Exception as exc:  # noqa: BLE001 - counted in stats; the prompt is computed here
            self.handoff_errors[type(exc).__name__] = self.handoff_errors.get(
                type(exc).__name__, 0) + 1
            return None, exc

    async def prefill_kv(self, request: GenerationRequest, held: int = 0,
                         held_version: int | None = None,
                         kv: list[Any] | None = None) -> Any:
        """PD prefill side: the K/V of the request's prompt, for a decode worker that
        already holds its first ``held`` tokens at weights ``held_version`` (their K/V
        are not sent). ``kv``: ``[the decode worker's last answer's K/V]`` (its
        ``export_kv``: an ObjectRef, an in-process task, or None when it kept none),
        imported instead of computed; one that cannot be fetched is counted and the
        answer computed here."""
        self._serving()
        prefill = getattr(self.engine, "prefill_kv", None)
        if prefill is None:
            raise TypeError(f"engine {type(self.engine).__name__} has no prefill_kv; "
                            "prefill-decode disaggregation needs an engine that exports K/V")
        tail, _ = await self._handoff(kv) if kv else (None, None)
        if tail is None:
            return await prefill(request, held, held_version)
        return await prefill(request, held, held_version, tail)

    async def export_kv(self, trajectory_id: str, start: int) -> Any:
        """PD decode side: the K/V its engine kept for the trajectory from position
        ``start`` on (the answer it sampled), for the trajectory's next prefill; None from
        an engine that keeps none or cannot export."""
        self._serving()
        export = getattr(self.engine, "export_kv", None)
        return await export(trajectory_id, start) if export is not None else None

    async def release(self, trajectory_id: str) -> bool:
        """The trajectory ended: free the K/V its engine kept for a next turn (engines
        without prefix reuse have nothing to free)."""
        release = getattr(self.engine, "release", None)
        return bool(await release(trajectory_id)) if release is not None else False

    async def release_many(self, trajectory_ids: list[str]) -> int:
        """:meth:`release` of each (the trajectories that ended together, in one call);
        how many kept K/V were freed."""
        return sum([await self.release(t) for t in trajectory_ids])

    async def abort(self, request_id: str) -> bool:
        if request_id in self._started:
            return await self.engine.abort(request_id)
        self._early_aborts[request_id] = None
        while len(self._early_aborts) > _MAX_EARLY_ABORTS:
            self._early_aborts.popitem(last=False)
        return False

    @register("execute_all")
    async def suspend(self) -> None:
        await self._engine_call(self.engine.suspend())

    @register("execute_all")
    async def resume(self) -> None:
        await self._engine_call(self.engine.resume())

    @register("execute_all")
    async def stage_weights(self, manifest: WeightManifest) -> None:
        """Start receiving the next version in the background; generation continues."""
        self._serving()
        self.stager.start(manifest)

    @register("execute_all")
    async def commit_weights(self) -> WeightUpdateReport:
        """At the suspend point: finish the receive and swap (step 3 + 5 of the protocol)."""
        self._serving()
        return await self._engine_call(self.stager.commit(self.engine))

    async def reload(self, manifest: WeightManifest | None,
                     staged: WeightManifest | None = None) -> int:
        """After a restart (EngineRecovery): load ``manifest`` (the version every other
        engine serves; None: the initial weights, version 0), start receiving ``staged``
        (published, not loaded yet) if any, then serve again. Returns the version loaded."""
        if self.dead is not None:
            self._serving()  # raises: a dead engine is reloaded in its restarted process
        if manifest is not None:
            self.stager.start(manifest)
            report = await self.stager.commit(self.engine)
            if report.version != manifest.version:
                raise RuntimeError(f"{self.name} reloaded version {report.version}, "
                                   f"not {manifest.version}")
        if staged is not None:
            self.stager.start(staged)
        self.restarted = False
        return self.engine.version

    async def weights_status(self) -> dict[str, Any]:
        """The staged version's transfer (``WeightStager.status``) and the engine's version."""
        self._serving()
        return {"name": self.name, "engine_version": self.engine.version,
                **self.stager.status()}

    async def await_weights(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the staged version to finish arriving (nothing is swapped in)."""
        self._serving()
        status = await self.stager.wait(timeout_s)
        return {"name": self.name, "engine_version": self.engine.version, **status}

    async def cancel_weights(self) -> None:
        """Drop the staged version (a failed transfer); the engine keeps its version."""
        self.stager.cancel()

    async def version(self) -> int:
        return self.engine.version

    async def restart_state(self) -> dict[str, Any]:
        """For EngineRecovery: the engine's version and whether this process is a restart
        that has not reloaded yet.

        Rehearsing a long restart (tests, drills): while the file named by the environment
        variable ``ROLLART_HOLD_RESTARTED`` exists, a restarted process says it is not
        ready (EngineRecovery asks again, up to ``restart_timeout_s``)."""
        if self.dead is not None:  # about to exit: not the process to reload
            self._serving()
        hold = os.environ.get(HOLD_RESTARTED_ENV)
        if self.restarted and hold and os.path.exists(hold):
            raise EngineRestartedError(f"{self.name} is held back while {hold} exists "
                                       f"({HOLD_RESTARTED_ENV})")
        return {"version": self.engine.version, "restarted": self.restarted}

    async def stats(self) -> dict[str, Any]:
        out = {"name": self.name, **self.engine.stats()}
        if self.handoff_errors:
            out["pd_handoff_errors"] = dict(self.handoff_errors)
        return out

    async def shutdown(self) -> None:
        try:
            await self.engine.shutdown()
        finally:  # the transport's buffers and connections go even if the engine's stop failed
            self.transport.close()


class TrainerWorker(ActorTrainWorker):
    """ActorTrain: one data-parallel rank of the trainer + the sending side of the transport.

    ``rank`` and ``world_size`` come from the Cluster (set before ``__init__``)."""

    def __init__(self, trainer: Descriptor, trainer_options: Any, model: ModelConfig,
                 transport: Descriptor, transport_options: Any,
                 init_method: str | None = None, threads: int | None = None,
                 offer: dict[str, Any] | None = None) -> None:
        """``offer``: what the backends may take besides their kind's arguments (a
        simulated run's ``sim`` context); they are offered this worker's ``binding`` too
        (``Descriptor.create``)."""
        one_thread(threads, compute=True)
        self.name = self.worker_name
        offered = {"binding": {"worker": self.name, **(self.binding or {})}, **(offer or {})}
        self.trainer = trainer.create(
            trainer_options, model=model, rank=self.rank, world_size=self.world_size,
            init_method=init_method, offer=offered,
        )
        self.transport = (
            transport.create(transport_options, role="sender", offer=offered)
            if self.rank == 0 else None
        )
        self._accumulate_s = 0.0  # compute seconds of the step's accumulate calls

    @register("dp_split", collect="list")
    def train_step(self, batch: Shard) -> MaybeAwaitable[dict[str, float]]:
        """One optimiser step on this rank's shard (the pipeline shards the batch with
        ``dp_shards``, the rule ``dp_split`` names; the trainer all-reduces gradients).
        On Ray the shard comes as a ``ShardRef``: this rank fetches it from the object
        store (cluster/shards.py). A trainer whose ``train_step`` is a coroutine (the
        simulator's, on virtual time) is awaited by the caller's handle; one that reports
        ``time/train_compute`` itself keeps its figure."""
        samples = fetch_shard(batch, self.rank)
        t0 = time.perf_counter()
        out = self.trainer.train_step(samples)
        if inspect.isawaitable(out):
            return _with_compute_time(out, t0)
        metrics = dict(out)
        metrics["time/train_compute"] = time.perf_counter() - t0
        if self._accumulate_s:  # the step's parts sent before it (accumulate)
            metrics["time/train_accumulate"] = self._accumulate_s
            self._accumulate_s = 0.0
        return metrics

    def can_accumulate(self) -> bool:
        """Whether the trainer adds a step up from parts (:meth:`accumulate`): one rank
        and a trainer whose ``can_accumulate`` says so (the torch trainer's does)."""
        return self.world_size == 1 and bool(getattr(self.trainer, "can_accumulate", False))

    def accumulate(self, batch: Shard) -> None:
        """Forward and backward of part of the next step's batch (whole groups); the next
        ``train_step`` ends the step with its own part (``train.stream_groups``)."""
        samples = fetch_shard(batch, self.rank)
        t0 = time.perf_counter()
        self.trainer.accumulate(samples)
        self._accumulate_s += time.perf_counter() - t0

    @register("execute_all")
    def publish_weights(self, bucket_bytes: int) -> MaybeAwaitable[WeightManifest | None]:
        """Export the current version as buckets; rank 0 publishes them. Other ranks take
        part only when the trainer's export is collective (``export_needs_all_ranks``:
        e.g. tensor-parallel shards gathered tensor by tensor), and return None."""
        if self.transport is None:
            if getattr(self.trainer, "export_needs_all_ranks", False):
                for _ in self.trainer.export_weights(bucket_bytes):
                    pass
            return None
        version = self.trainer.version
        manifest: MaybeAwaitable[WeightManifest] = self.transport.publish(
            version, self.trainer.export_weights(bucket_bytes))
        return manifest  # a coroutine from a transport that takes (virtual) time to publish

    @register("rank0")
    def release_weights(self, version: int) -> None:
        """Every engine committed a newer version: the transport may drop this one."""
        assert self.transport is not None, "only rank 0 publishes weights"
        self.transport.release(version)

    def version(self) -> int:
        return self.trainer.version

    @register("execute_all")
    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)

    @register("execute_all")
    def load_checkpoint(self, path: str) -> None:
        self.trainer.load_checkpoint(path)

    @register("execute_all")
    def save_pretrained(self, path: str) -> None:
        self.trainer.save_pretrained(path)


async def _with_compute_time(metrics: Awaitable[dict[str, float]],
                             t0: float) -> dict[str, float]:
    out = dict(await metrics)
    out.setdefault("time/train_compute", time.perf_counter() - t0)
    return out


def create_rewards(rewards: dict[str, tuple[Descriptor, Any]]) -> dict[str, Any]:
    """Each task's reward backend; a backend that cannot start (a serverless deploy that
    failed, a judge model that did not load) raises :class:`BackendStartError` naming the
    task and backend, with the backend's own reason (a ConfigError stays as it is)."""
    from rollart_sdk.errors import BackendStartError, ConfigError

    out: dict[str, Any] = {}
    for tag, (desc, opts) in rewards.items():
        try:
            out[tag] = desc.create(opts)
        except ConfigError:
            raise
        except Exception as exc:
            raise BackendStartError(
                f"task {tag!r}: reward {desc.name!r} could not start: "
                f"{type(exc).__name__}: {exc}") from exc
    return out


class RewardBackendWorker(RewardWorker):
    """Reward: the reward backend of every task, called once per finished trajectory."""

    def __init__(self, rewards: dict[str, tuple[Descriptor, Any]]) -> None:
        one_thread()
        self.name = self.worker_name
        self._backends = create_rewards(rewards)

    async def score(self, tag: str, request: RewardRequest) -> RewardResult:
        return await self._backends[tag].score(request)


class RewardRouter:
    """Where ``score(tag, request)`` goes: the backends that declared no resources (rule,
    serverless) live here, in the control plane's process, and are awaited directly - no
    reserved actor, no Ray hop; the others (a judge model) are called on the reward worker.
    """

    def __init__(self, local: dict[str, tuple[Descriptor, Any]],
                 remote: WorkerHandle | None = None) -> None:
        self._local = create_rewards(local)
        self._remote = remote  # the handle of a RewardBackendWorker, or None

    @property
    def local_tags(self) -> list[str]:
        return sorted(self._local)

    def set_backend(self, tag: str, backend: Any) -> None:
        """Score task ``tag`` with ``backend`` (any object with ``async score``) from now
        on: the simulator's shared reward pools (rollart_sdk.sim.reward_pool)."""
        self._local[tag] = backend

    async def score(self, tag: str, request: RewardRequest) -> RewardResult:
        backend = self._local.get(tag)
        if backend is not None:
            return await backend.score(request)
        if self._remote is None:
            raise KeyError(f"no reward backend for task {tag!r}")
        return await self._remote.reward.score(tag, request)


# The worker class of each role, as build_job spawns them; `rollart validate` checks their
# decorators (hw_mapping hardware, serverless URL schemes) against the config's pools.
ROLE_WORKERS: dict[str, type] = {
    "actor_train": TrainerWorker,
    "actor_gen": EngineWorker,
    "reward": RewardBackendWorker,
    "environment": EnvWorker,
}

if TYPE_CHECKING:  # mypy checks each worker against its role's Protocol (cluster/hosts.py)
    _engine: type[EngineHost] = EngineWorker
    _trainer: type[TrainerHost] = TrainerWorker
    _reward: type[RewardHost] = RewardBackendWorker
    _router: type[RewardHost] = RewardRouter
