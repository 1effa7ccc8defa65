"""The ``sim`` env, reward, trainer and transport: workload profiles and cost models.

Registered like any backend (``rollart_sdk.default_plugins.sims``) and hosted by the real
role workers (the env by the virtual-time env host, :mod:`rollart_sdk.cluster.envs.virtual`),
which offer them the run's :class:`SimContext`; what they model they sleep on the virtual
clock.

- env ``sim`` (:class:`SimEnv`): a text env describing one task's workload: episode
  length, reset / step latency distributions (normal, lognormal tails), failure
  probabilities, observation and response token counts. Observations are ``"sim-obs N"``
  (N tokens); the draws are seeded by the reset seed and the environment's id, so the same
  launch replays the same episode in every mode.
- reward ``sim`` (:class:`SimReward`): a serverless function: a call finds a warm
  instance (warm latency) or starts one (cold latency); an instance idle longer than
  ``keep_warm_s`` is reclaimed (scale to zero).
- trainer ``sim`` (:class:`SimTrainer`): the seconds of a train step from FLOPs per token
  of the samples it runs (with ``skip_zero_advantage``, those whose advantage is not 0),
  plus the gradient all-reduce across ranks.
- transport ``sim`` (:class:`SimTransport`): bandwidths of the trainer -> store publish
  (across clusters), the engines' pull (inside a cluster) or a synchronous broadcast.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium
from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.errors import ConfigError
from rollart_sdk.sim.costs import (
    Dist,
    HardwareClass,
    ModelSpec,
    const,
    resolve_hardware,
    train_step_s,
)
from rollart_sdk.types import (
    BucketRef,
    RewardRequest,
    RewardResult,
    TrainSample,
    WeightBucket,
    WeightManifest,
)


class _Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- env
class SimEnvOptions(_Opts):
    """Options of env ``sim``: one task's workload (all times in seconds)."""

    turns: Dist = Field(default_factory=lambda: const(1), description="turns per episode")
    reset_s: Dist = Field(default_factory=lambda: const(0.0), description="env.reset latency")
    step_s: Dist = Field(default_factory=lambda: const(0.0), description="env.step latency")
    first_obs_tokens: Dist = Field(default_factory=lambda: const(256),
                                   description="tokens of the first prompt")
    obs_tokens: Dist = Field(default_factory=lambda: const(64),
                             description="tokens each later observation adds")
    response_tokens: Dist = Field(default_factory=lambda: const(128),
                                  description="tokens the model writes per turn")
    reset_failure: float = Field(0.0, ge=0, le=1, description="probability reset raises")
    step_failure: float = Field(0.0, ge=0, le=1, description="probability a step raises")
    success: float = Field(0.5, ge=0, le=1, description="probability an episode succeeds")


class SimEnvFailure(RuntimeError):
    """A modelled environment failure (e.g. a container that did not start)."""


class SimEnv(gymnasium.Env):
    """One environment of a simulated task (see the module docstring)."""

    system_prompt = None
    action_vocabulary = None

    def __init__(self, **options: Any) -> None:
        self.opts = SimEnvOptions(**options)
        self.instance_key = ""  # set by the worker: the env's id (keys its draws)
        self.last_latency_s = 0.0
        self._rng = random.Random(0)
        self._turn = 0
        self._turns = 1
        self._success = False

    def _obs(self, dist: Dist) -> str:
        return f"sim-obs {dist.draw_int(self._rng, at_least=1)}"

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        key = zlib.crc32(self.instance_key.encode())
        self._rng = random.Random((seed or 0) * 1_000_003 + key)
        o = self.opts
        self.last_latency_s = o.reset_s.draw(self._rng)
        self._turn = 0
        self._turns = o.turns.draw_int(self._rng, at_least=1)
        self._success = self._rng.random() < o.success
        if self._rng.random() < o.reset_failure:
            raise SimEnvFailure("simulated reset failure (tasks[].env.options.reset_failure)")
        return self._obs(o.first_obs_tokens), {"turns": self._turns}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        o = self.opts
        self.last_latency_s = o.step_s.draw(self._rng)
        if self._rng.random() < o.step_failure:
            raise SimEnvFailure("simulated step failure (tasks[].env.options.step_failure)")
        self._turn += 1
        done = self._turn >= self._turns
        reward = 1.0 if done and self._success else 0.0
        info = {"success": self._success} if done else {}
        return self._obs(o.obs_tokens), reward, done, False, info


# --------------------------------------------------------------------------- reward
class SimRewardOptions(_Opts):
    """Options of reward ``sim``: a serverless function's latencies."""

    warm_s: Dist = Field(default_factory=lambda: const(0.01), description="call on a warm instance")
    cold_s: Dist = Field(default_factory=lambda: const(1.0), description="extra cold start")
    keep_warm_s: float = Field(60.0, ge=0, description="idle time before scale to zero")
    seed: int = Field(0, description="seed of the latency draws")


class SimReward:
    """A serverless reward; its ``score`` returns a latency the worker sleeps
    (``latency_for``) and the env's return as the reward."""

    def __init__(self, **options: Any) -> None:
        self.opts = SimRewardOptions(**options)
        self._rng = random.Random(self.opts.seed)
        self._idle_since: list[float] = []  # warm idle instances: when each went idle
        self.cold_starts = 0
        self.calls = 0

    def acquire(self, now: float) -> float:
        """Seconds the call at ``now`` takes; takes a warm instance or starts one."""
        self.calls += 1
        keep = self.opts.keep_warm_s
        self._idle_since = [t for t in self._idle_since if now - t <= keep]
        latency = self.opts.warm_s.draw(self._rng)
        if self._idle_since:
            self._idle_since.pop()
        else:
            self.cold_starts += 1
            latency += self.opts.cold_s.draw(self._rng)
        return latency

    def release(self, now: float) -> None:
        self._idle_since.append(now)

    async def score(self, request: RewardRequest) -> RewardResult:
        import asyncio

        loop = asyncio.get_running_loop()
        latency = self.acquire(loop.time())
        try:
            await asyncio.sleep(latency)
        finally:
            self.release(loop.time())
        return RewardResult(request.trajectory_id, float(request.env_return),
                            {"latency_s": latency})


# --------------------------------------------------------------------------- trainer
class SimTrainerOptions(_Opts):
    """Options of trainer ``sim``."""

    devices: int = Field(8, ge=1, description="devices per trainer worker (a data-parallel rank)")
    flops_per_token_factor: float = Field(8.0, gt=0, description="x N FLOPs per token")
    step_overhead_s: float = Field(0.0, ge=0, description="fixed seconds per train step")
    skip_zero_advantage: bool = Field(
        False, description="charge only the samples whose advantage is not 0, as the torch "
                           "trainer's skip_zero_advantage runs only those (off: every sample "
                           "is charged, as a trainer that runs the whole batch)")


class SimTrainer:
    """A trainer rank on virtual time (:class:`rollart_sdk.interfaces.Trainer`): a step
    sleeps the FLOPs time of the samples it runs (``train_step_s`` on the rank's
    hardware) plus the gradient all-reduce across ranks; ``export_weights`` yields the
    model's bytes as tensor-less buckets (:class:`SimWeightBucket`); there is nothing to
    checkpoint."""

    def __init__(self, devices: int = 8, flops_per_token_factor: float = 8.0,
                 step_overhead_s: float = 0.0, skip_zero_advantage: bool = False, *,
                 hardware: HardwareClass, model_spec: ModelSpec, token_block: int = 1,
                 world_size: int = 1, allreduce_gbps: float = 400.0, **_: Any) -> None:
        self.hw = hardware
        self.devices = devices
        self.factor = flops_per_token_factor
        self.overhead = step_overhead_s
        self.skip_zero_advantage = skip_zero_advantage
        self.spec = model_spec
        self.block = token_block
        self.world_size = world_size
        self.allreduce_gbps = allreduce_gbps
        self.version = 0

    def step_s(self, seq_lengths: list[int]) -> float:
        return train_step_s(self.hw, self.devices, self.spec,
                            [n * self.block for n in seq_lengths], self.factor, self.overhead)

    def allreduce_s(self) -> float:
        """The gradient all-reduce's seconds (a ring across the data-parallel ranks)."""
        n = self.world_size
        if n <= 1:
            return 0.0
        return 2 * self.spec.weight_bytes * (n - 1) / n * 8 / (self.allreduce_gbps * 1e9)

    async def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        run = self.samples_run(batch)
        compute = self.step_s([len(s.input_ids) for s in run])
        await asyncio.sleep(compute + self.allreduce_s())
        self.version += 1
        tokens = sum(len(s.input_ids) for s in batch) * self.block
        ran = sum(len(s.input_ids) for s in run) * self.block
        # forward_*: the samples charged, as the torch trainer reports those it ran.
        return {"loss": 0.0, "time/train_compute": compute, "sim/train_tokens": float(tokens),
                "forward_sequences": float(len(run)), "forward_tokens": float(ran)}

    def export_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]:
        nbytes = self.spec.weight_bytes
        n = max(1, int(-(-nbytes // max(bucket_bytes, 1))))
        for i in range(n):
            yield SimWeightBucket(self.version, i, {}, size=int(nbytes // n), total=nbytes)

    def save_checkpoint(self, path: str) -> None:
        return None  # nothing to save: the simulation has no weights

    def load_checkpoint(self, path: str) -> None:
        return None

    def save_pretrained(self, path: str) -> None:
        return None

    def samples_run(self, batch: list[TrainSample]) -> list[TrainSample]:
        """The samples a step runs through the model: all, or with ``skip_zero_advantage``
        those whose GRPO advantage is not 0 (a sample's own ``advantage`` if set, else 0
        exactly when its group's rewards are all equal or it equals their mean: the
        rule of ``rollart_sdk.algorithms.grpo_advantages``). Groups are judged on this
        rank's shard of the batch (the torch trainer gathers them over all ranks)."""
        if not self.skip_zero_advantage:
            return batch
        groups: dict[str, list[float]] = {}
        for s in batch:
            groups.setdefault(s.group_id, []).append(float(s.reward))

        def zero(s: TrainSample) -> bool:
            if s.advantage is not None:
                return s.advantage == 0
            rewards = groups[s.group_id]
            return max(rewards) == min(rewards) or float(s.reward) == sum(rewards) / len(rewards)

        return [s for s in batch if not zero(s)]


def create_trainer(model: Any = None, rank: int = 0, world_size: int = 1,
                   init_method: str | None = None, *, sim: SimContext | None = None,
                   binding: dict[str, Any] | None = None, **options: Any) -> SimTrainer:
    """Trainer ``sim``'s factory (``factory(model=, rank=, world_size=, init_method=,
    **options)``): the rank's hardware class is its binding's, the model and token block
    the run's ``sim:`` section's (the ``sim`` context a simulated run offers)."""
    ctx = _require(sim, "trainer")
    return SimTrainer(**options, hardware=ctx.hardware_of(binding), model_spec=ctx.model,
                      token_block=ctx.token_block, world_size=world_size,
                      allreduce_gbps=ctx.allreduce_gbps)


# --------------------------------------------------------------------------- transport
class SimTransportOptions(_Opts):
    """Options of transport ``sim`` (bandwidths in Gb/s, as links are sold)."""

    style: Literal["pull", "push"] = Field(
        "pull", description="pull: publish once to a store, engines pull in the background "
                            "(Mooncake); push: a broadcast at the suspend point (NCCL)")
    publish_gbps: float = Field(200.0, gt=0, description="trainer -> store (across clusters)")
    pull_gbps: float = Field(400.0, gt=0, description="store -> one engine (inside a cluster)")
    store_gbps: float = Field(3200.0, gt=0, description="the store's total serving bandwidth")
    push_gbps: float = Field(200.0, gt=0, description="trainer -> engines broadcast")
    swap_s: float = Field(0.5, ge=0, description="loading a received version into an engine")


class SimTransport:
    """The weights' bandwidths (:class:`rollart_sdk.interfaces.WeightTransport`): the
    sender's ``publish`` takes the publish time (virtual seconds) and returns the
    manifest; the receiving side's times are ``pull_s`` / ``push_s`` / ``swap_s``."""

    def __init__(self, role: str = "sender", **options: Any) -> None:
        self.role = role
        self.opts = SimTransportOptions(**options)

    @property
    def style(self) -> str:
        return self.opts.style

    def publish_s(self, nbytes: float) -> float:
        return 0.0 if self.opts.style == "push" else nbytes * 8 / (self.opts.publish_gbps * 1e9)

    def pull_s(self, nbytes: float, receivers: int) -> float:
        """Every engine pulls at once: each at its link, all within the store's total."""
        o = self.opts
        rate = min(o.pull_gbps, o.store_gbps / max(1, receivers))
        return nbytes * 8 / (rate * 1e9)

    def push_s(self, nbytes: float) -> float:
        return nbytes * 8 / (self.opts.push_gbps * 1e9)

    async def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        """Publish ``buckets`` (the trainer's :class:`SimWeightBucket`): sleep the publish
        time of the model's bytes, then hand out the manifest."""
        refs, total = [], 0.0
        for b in buckets:
            refs.append(BucketRef(b.index, [], b.nbytes, ""))
            total = getattr(b, "total", total + b.nbytes)
        publish = self.publish_s(total)
        await asyncio.sleep(publish)
        return WeightManifest(version, "sim", refs, {"publish_s": publish})

    def receive_on_loop(self, manifest: WeightManifest
                        ) -> list[WeightBucket] | Awaitable[list[WeightBucket]]:
        """The receiving side (an engine's ``WeightStager``, on the loop): ``pull``
        sleeps the pull of the version's bytes by all the engines at once
        (``meta["receivers"]``); ``push`` moves nothing before the suspend point (the
        buckets are there at once). What remains for the swap (``push``: the broadcast;
        both: ``swap_s``) the buckets carry as ``at_load``, which the sim engine's
        ``load_weights`` sleeps."""
        if self.opts.style == "push":
            return self._buckets(manifest, (self.push_s(manifest.nbytes), self.opts.swap_s))
        return self._pull(manifest)

    async def _pull(self, manifest: WeightManifest) -> list[WeightBucket]:
        await asyncio.sleep(self.pull_s(manifest.nbytes, int(manifest.meta.get("receivers", 1))))
        return self._buckets(manifest, (self.opts.swap_s,))

    @staticmethod
    def _buckets(manifest: WeightManifest, at_load: tuple[float, ...]) -> list[WeightBucket]:
        return [SimWeightBucket(manifest.version, b.index, {}, size=b.nbytes,
                                at_load=at_load if i == 0 else ())
                for i, b in enumerate(manifest.buckets)]

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        raise RuntimeError("transport 'sim' is received on the event loop (receive_on_loop): "
                           "it runs only on simulated time (rollart sim)")

    def release(self, version: int) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass
class SimWeightBucket(WeightBucket):
    """A bucket with no tensors: ``size`` bytes of a version of ``total`` bytes (as the
    trainer exported it); ``at_load``: the seconds the swap still takes, slept in turn by
    the sim engine's ``load_weights`` (the receiving transport's)."""

    size: int = 0
    total: float = 0.0
    at_load: tuple[float, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.size


@dataclass
class SimContext:
    """What a simulated run offers its sim backends (``Descriptor.create``'s ``offer``):
    the model, the hardware classes by name, the token block and each task's response
    lengths (from its sim env's options)."""

    model: ModelSpec
    hardware: dict[str, HardwareClass]
    response_tokens: dict[str, Dist] = field(default_factory=dict)
    token_block: int = 1
    allreduce_gbps: float = 400.0

    def hardware_of(self, binding: dict[str, Any] | None) -> HardwareClass:
        """The hardware class of a worker bound as ``binding`` (its pool's hardware)."""
        return resolve_hardware((binding or {}).get("hardware", ""), self.hardware)


def _require(sim: SimContext | None, kind: str) -> SimContext:
    if sim is None:
        raise ConfigError([(f"{kind}.name", f"{kind} 'sim' models time: it runs only on "
                            "simulated time (rollart sim, or clock: simulated)")])
    return sim


# --------------------------------------------------------------------------- prompt format
class SimFormat:
    """The sim's "tokenizer": an observation ``"sim-obs N"`` is N tokens, written as
    ceil(N / token_block) ids (one id stands for ``token_block`` tokens, so a long context
    costs little memory; the engine and trainer multiply back)."""

    def __init__(self, token_block: int = 1) -> None:
        self.block = token_block

    def _ids(self, observation: str) -> list[int]:
        try:
            n = int(observation.rsplit(" ", 1)[-1])
        except ValueError:
            n = len(observation.split())
        return [2] * max(1, -(-n // self.block))

    def first_prompt(self, observation: str, system: str | None = None) -> list[int]:
        return self._ids(observation)

    def next_observation(self, observation: str, action_ids: list[int]) -> list[int]:
        return self._ids(observation)

    def decode(self, ids: list[int]) -> str:
        return f"sim-act {len(ids) * self.block}"

    def action_token_ids(self, vocabulary: list[str]) -> list[int]:
        return []
