"""The role workers of a simulated job: ActorGen and ActorTrain on virtual time (the
Environment role's is the virtual-time env host, :mod:`rollart_sdk.cluster.envs.virtual`).

They subclass the same role bases as the real workers (:mod:`rollart_sdk.cluster.roles`)
and carry the same method declarations (``@hw_mapping`` on ``generate``, ``dp_split``
on ``train_step``, ``execute_all`` on the weight calls), so the LocalSpawner binds them to
the planned pools and the route table is built by the one routing rule. Where a real
worker computes, these sleep the modelled duration on the virtual clock; the control plane
above them (LLMProxy, EnvManager, RolloutScheduler, SampleBuffer, Pipeline, WeightSync)
is the real one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.cluster.decorators import hw_mapping, register
from rollart_sdk.cluster.envs.virtual import VirtualEnvHost
from rollart_sdk.cluster.worker import ActorGenWorker, ActorTrainWorker
from rollart_sdk.sim.backends import SimTransport
from rollart_sdk.sim.costs import Dist, HardwareClass, ModelSpec, resolve_hardware
from rollart_sdk.types import (
    BucketRef,
    GenerationRequest,
    GenerationResult,
    TrainSample,
    WeightManifest,
    WeightUpdateReport,
)


@dataclass
class SimContext:
    """What every sim worker shares: the model, the hardware classes, the transport."""

    model: ModelSpec
    hardware: dict[str, HardwareClass]
    transport: SimTransport
    response_tokens: dict[str, Dist] = field(default_factory=dict)
    token_block: int = 1
    allreduce_gbps: float = 400.0

    def hardware_of(self, worker: Any) -> HardwareClass:
        name = (getattr(worker, "binding", None) or {}).get("hardware", "")
        return resolve_hardware(name, self.hardware)


def _now() -> float:
    return asyncio.get_running_loop().time()


class SimEngineWorker(ActorGenWorker):
    """ActorGen: a :class:`~rollart_sdk.sim.engine.SimEngine` plus the receiving side of
    the simulated transport (background pull, or a broadcast at commit for ``push``)."""

    def __init__(self, engine: Any, engine_options: Any, ctx: SimContext) -> None:
        self.name = self.worker_name
        self.ctx = ctx
        self.engine = engine.create(
            engine_options, hardware=ctx.hardware_of(self), model_spec=ctx.model,
            hardware_name=(self.binding or {}).get("hardware", ""),
            response_tokens=ctx.response_tokens, token_block=ctx.token_block, name=self.name)
        self._staged: tuple[WeightManifest, asyncio.Task[None] | None, float] | None = None

    @hw_mapping({})
    async def generate(self, request: GenerationRequest,
                       kv: list[Any] | None = None) -> GenerationResult:
        """``kv``: PD, ``[the prefill worker's hand-off]`` (an awaitable); its K/V take
        the link's time to arrive, then the engine decodes without prefilling."""
        handoff = None
        if kv:
            handoff = await kv[0]
            await asyncio.sleep(self.engine.kv_transfer_s(handoff))
        result: GenerationResult = await self.engine.generate(request, kv=handoff)
        result.worker = self.name
        return result

    async def prefill_kv(self, request: GenerationRequest, held: int = 0,
                         held_version: int | None = None, kv: list[Any] | None = None) -> Any:
        """PD prefill side (see :meth:`rollart_sdk.sim.engine.SimEngine.prefill_kv`);
        ``kv``: ``[the decode engine's last answer's K/V]``, which cross the link first."""
        tail = (await kv[0]) if kv else None
        if tail is not None:
            await asyncio.sleep(self.engine.kv_transfer_s(tail))
        return await self.engine.prefill_kv(request, held, held_version, tail)

    async def abort(self, request_id: str) -> bool:
        return bool(await self.engine.abort(request_id))

    async def export_kv(self, trajectory_id: str, start: int) -> Any:
        """PD decode side (see :meth:`rollart_sdk.sim.engine.SimEngine.export_kv`)."""
        return await self.engine.export_kv(trajectory_id, start)

    async def release(self, trajectory_id: str) -> bool:
        """The trajectory ended: forget its cached prefix."""
        return bool(await self.engine.release(trajectory_id))

    @register("execute_all")
    async def suspend(self) -> None:
        await self.engine.suspend()

    @register("execute_all")
    async def resume(self) -> None:
        await self.engine.resume()

    @register("execute_all")
    async def stage_weights(self, manifest: WeightManifest) -> None:
        t = self.ctx.transport
        if t.style == "push":  # nothing moves before the suspend point
            self._staged = (manifest, None, 0.0)
            return
        pull = t.pull_s(manifest.nbytes, int(manifest.meta.get("receivers", 1)))
        task = asyncio.ensure_future(asyncio.sleep(pull))
        self._staged = (manifest, task, pull)

    async def weights_status(self) -> dict[str, Any]:
        """The staged version's transfer, as ``WeightStager.status`` reports it."""
        out: dict[str, Any] = {"name": self.name, "engine_version": self.engine.version,
                               "version": None, "ready": False, "error": None,
                               "transfer_s": 0.0}
        if self._staged is not None:
            manifest, task, transfer = self._staged
            out.update(version=manifest.version, transfer_s=transfer,
                       ready=task is None or task.done())  # push: moves at the commit
        return out

    async def await_weights(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the staged version to arrive (nothing is swapped in)."""
        if self._staged is not None and self._staged[1] is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._staged[1]), timeout_s)
            except TimeoutError:
                pass  # reported as not ready
        return await self.weights_status()

    async def cancel_weights(self) -> None:
        """Drop the staged version; the engine keeps its own."""
        if self._staged is not None and self._staged[1] is not None:
            self._staged[1].cancel()
        self._staged = None

    @register("execute_all")
    async def commit_weights(self) -> WeightUpdateReport:
        if self._staged is None:
            raise RuntimeError(f"{self.name}: commit_weights without a staged version")
        manifest, task, transfer = self._staged
        self._staged = None
        t0 = _now()
        t = self.ctx.transport
        if task is None:
            transfer = t.push_s(manifest.nbytes)
            await asyncio.sleep(transfer)
        else:
            await task
        await asyncio.sleep(t.opts.swap_s)
        recomputed = await self.engine.load_weights([], manifest.version)
        return WeightUpdateReport(manifest.version, transfer, _now() - t0, manifest.nbytes,
                                  recomputed)

    async def version(self) -> int:
        return int(self.engine.version)

    async def stats(self) -> dict[str, Any]:
        return self.engine_stats()

    def engine_stats(self) -> dict[str, Any]:
        b = self.binding or {}
        return {"name": self.name, "pool": b.get("pool"), "hardware_name": b.get("hardware"),
                **self.engine.stats()}

    async def shutdown(self) -> None:
        await self.engine.shutdown()


class SimTrainerWorker(ActorTrainWorker):
    """ActorTrain: one data-parallel rank; a step sleeps its FLOPs time plus the gradient
    all-reduce across ranks; rank 0 publishes at the transport's publish bandwidth."""

    def __init__(self, trainer: Any, trainer_options: Any, ctx: SimContext) -> None:
        self.name = self.worker_name
        self.ctx = ctx
        self.trainer = trainer.create(trainer_options, hardware=ctx.hardware_of(self),
                                      model_spec=ctx.model, token_block=ctx.token_block)
        self.steps_s: list[float] = []

    def allreduce_s(self) -> float:
        n = self.world_size
        if n <= 1:
            return 0.0
        return 2 * self.ctx.model.weight_bytes * (n - 1) / n * 8 / (self.ctx.allreduce_gbps * 1e9)

    @register("dp_split", collect="list")
    async def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        run = self.trainer.samples_run(batch)
        compute = self.trainer.step_s([len(s.input_ids) for s in run])
        dt = compute + self.allreduce_s()
        await asyncio.sleep(dt)
        self.trainer.version += 1
        self.steps_s.append(dt)
        tokens = sum(len(s.input_ids) for s in batch) * self.ctx.token_block
        ran = sum(len(s.input_ids) for s in run) * self.ctx.token_block
        # forward_*: the samples charged, as the torch trainer reports those it ran.
        return {"loss": 0.0, "time/train_compute": compute, "sim/train_tokens": float(tokens),
                "forward_sequences": float(len(run)), "forward_tokens": float(ran)}

    @register("execute_all")
    async def publish_weights(self, bucket_bytes: int) -> WeightManifest | None:
        if self.rank != 0:
            return None
        nbytes = self.ctx.model.weight_bytes
        publish = self.ctx.transport.publish_s(nbytes)
        await asyncio.sleep(publish)
        n = max(1, int(-(-nbytes // max(bucket_bytes, 1))))
        buckets = [BucketRef(i, [], int(nbytes // n), "") for i in range(n)]
        return WeightManifest(self.trainer.version, "sim", buckets, {"publish_s": publish})

    @register("rank0")
    async def release_weights(self, version: int) -> None:
        return None

    async def version(self) -> int:
        return int(self.trainer.version)

    @register("execute_all")
    async def save_checkpoint(self, path: str) -> None:
        return None  # nothing to save: the simulation has no weights


SIM_ROLE_WORKERS: dict[str, type] = {
    "actor_train": SimTrainerWorker,
    "actor_gen": SimEngineWorker,
    "environment": VirtualEnvHost,
}

