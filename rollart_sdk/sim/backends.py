"""The ``sim`` env, reward, trainer and transport: workload profiles and cost models.

Registered like any backend (``rollart_sdk.default_plugins.sims``); the sim role workers
(:mod:`rollart_sdk.sim.workers`) turn what they return into virtual-time sleeps.

- env ``sim`` (:class:`SimEnv`): a text env describing one task's workload: episode
  length, reset / step latency distributions (normal, lognormal tails), failure
  probabilities, observation and response token counts. Observations are ``"sim-obs N"``
  (N tokens); the draws are seeded by the reset seed and the environment's id, so the same
  launch replays the same episode in every mode.
- reward ``sim`` (:class:`SimReward`): a serverless function: a call finds a warm
  instance (warm latency) or starts one (cold latency); an instance idle longer than
  ``keep_warm_s`` is reclaimed (scale to zero).
- trainer ``sim`` (:class:`SimTrainer`): the seconds of a train step from FLOPs per token
  of the samples it runs (with ``skip_zero_advantage``, those whose advantage is not 0).
- transport ``sim`` (:class:`SimTransport`): bandwidths of the trainer -> store publish
  (across clusters), the engines' pull (inside a cluster) or a synchronous broadcast.
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Literal

import gymnasium
from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.sim.costs import Dist, HardwareClass, ModelSpec, const, train_step_s
from rollart_sdk.types import RewardRequest, RewardResult, TrainSample


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
    """The train step's duration on a worker's hardware (see ``train_step_s``)."""

    def __init__(self, devices: int = 8, flops_per_token_factor: float = 8.0,
                 step_overhead_s: float = 0.0, skip_zero_advantage: bool = False, *,
                 hardware: HardwareClass, model_spec: ModelSpec, token_block: int = 1,
                 **_: Any) -> None:
        self.hw = hardware
        self.devices = devices
        self.factor = flops_per_token_factor
        self.overhead = step_overhead_s
        self.skip_zero_advantage = skip_zero_advantage
        self.spec = model_spec
        self.block = token_block
        self.version = 0

    def step_s(self, seq_lengths: list[int]) -> float:
        return train_step_s(self.hw, self.devices, self.spec,
                            [n * self.block for n in seq_lengths], self.factor, self.overhead)

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
    def __init__(self, **options: Any) -> None:
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
