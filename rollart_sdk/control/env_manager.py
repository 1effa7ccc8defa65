"""EnvManager: one environment's life on its own timeline (R2).

reset -> (generate through the LLMProxy -> env.step)* -> done -> reward, token in / token
out. Every call has a timeout; a failing or hanging environment ends only its own
trajectory (recorded as dropped, with the reason) and blocks nobody. An ABORT (eviction
by the staleness bound, surplus of a redundant rollout, shutdown) ends it the same way.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollart_sdk.cluster.envs.errors import EnvHung
from rollart_sdk.cluster.handles import WorkerHandle
from rollart_sdk.config import TaskConfig
from rollart_sdk.control.aio import wait_for
from rollart_sdk.control.chat import ChatFormat
from rollart_sdk.control.lockstep import StartGate, TurnBarrier
from rollart_sdk.control.proxy import LLMProxy, RequestKillsEngines
from rollart_sdk.types import (
    GenerationRequest,
    GenerationResult,
    RewardRequest,
    SamplingParams,
    Trajectory,
    Turn,
)

_BACKSTOP_S = 10.0  # caller-side margin over an env call's own (worker-side) timeout
MAX_REASON_CHARS = 1000  # a drop reason keeps at most this much of the exception text


def bounded(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _env_reason(call: str, exc: BaseException, timeout: float) -> str:
    """Drop reason for a failed env ``reset``/``step``: ``env_<call>_timeout`` when it
    hung, saying what became of the env (a worker killed its process; a thread host gave
    the call up, its thread runs on; no host answered at all), else ``env_<call>_failed``
    with the env's exception text."""
    name = type(exc).__name__
    why = None
    if isinstance(exc, EnvHung) and not exc.killed:
        why = "env_host: thread: the call was given up; its thread runs on, it cannot be killed"
    elif isinstance(exc, EnvHung) or "EnvHung" in name or "EnvHung" in str(exc)[:200]:
        why = "the env's process was killed"
    elif isinstance(exc, asyncio.TimeoutError):
        why = "its env host did not answer"
    if why is not None:
        return f"env_{call}_timeout: no {call} within {timeout}s ({why})"
    text = str(exc)
    # Ray wraps a remote error; keep the env's own "Type: message" when it is there.
    if "EnvCallError" in type(exc).__name__ or text.startswith(("EnvCallError", "ray::")):
        text = text.splitlines()[-1] if text else text
    return bounded(f"env_{call}_failed: {type(exc).__name__}: {text}")


@dataclass
class TaskRuntime:
    """What an EnvManager needs to know about its task, resolved once at start-up."""

    config: TaskConfig
    system_prompt: str | None = None
    allowed_token_ids: list[int] | None = None
    prompt_format: Any = None  # ChatFormat / PlainFormat of this task; None: the shared one
    # An agent task (its env an AgentEnv): the run's OpenAI-compatible gateway, and how
    # the model's text becomes tool calls (rollart_sdk.gateway.tools).
    gateway: Any = None
    tool_parser: str = "hermes"
    # A held-out evaluation's runtime (control/evaluation.py): nothing it samples is trained,
    # so an agent's requests may ask for their own temperature / top_p (ignored: the eval's
    # sampling settings apply).
    evaluation: bool = False

    def sampling(self, seed: int) -> SamplingParams:
        s = self.config.sampling
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_new_tokens=1 if self.allowed_token_ids else s.max_new_tokens,
            seed=seed,
            allowed_token_ids=self.allowed_token_ids,
        )


class EnvManager:
    """Runs one environment's episodes, one at a time: ``run()`` plays the current
    trajectory, ``next_episode(...)`` starts another on the same environment (pooled, the
    paper's reset -> episode loop). ``abort(reason)`` ends the current one at any point."""

    def __init__(
        self,
        trajectory: Trajectory,
        seed: int,
        sample_seed: int,
        task: TaskRuntime,
        chat: ChatFormat,
        proxy: LLMProxy,
        env_worker: WorkerHandle,
        reward_worker: WorkerHandle,
        version: Callable[[], int],
        event_sink: Callable[[dict[str, Any]], None] | None = None,
        barrier: TurnBarrier | None = None,
        env_id: str | None = None,
        gate: StartGate | None = None,
    ) -> None:
        self.task = task
        self.chat = task.prompt_format or chat
        self.proxy = proxy
        self.env = env_worker
        self.reward = reward_worker
        self.env_host = env_worker.env  # the typed calls (cluster.hosts.EnvHost)
        self.reward_host = reward_worker.reward
        self.version = version
        self._emit = event_sink or (lambda e: None)
        # Pooled (env_id given): the env instance outlives the episode and the pool closes
        # it; otherwise the instance is this trajectory's own and is closed after it.
        self.pooled_env_id = env_id
        self.episodes = 0
        self._begin(trajectory, seed, sample_seed, barrier, gate)

    def next_episode(self, trajectory: Trajectory, seed: int, sample_seed: int,
                     barrier: TurnBarrier | None = None, env_id: str | None = None,
                     gate: StartGate | None = None) -> None:
        """Reuse this manager and its environment for another episode (reset -> episode)."""
        if not self._finished:
            raise RuntimeError(f"EnvManager {self.env_id}: the current episode is still running")
        if env_id is not None:
            self.pooled_env_id = env_id  # the pool replaced a failed instance
        self._begin(trajectory, seed, sample_seed, barrier, gate)

    def _begin(self, trajectory: Trajectory, seed: int, sample_seed: int,
               barrier: TurnBarrier | None, gate: StartGate | None = None) -> None:
        self.traj = trajectory
        # The policy its tokens are sampled from; the trainer recomputes the same one.
        trajectory.temperature = self.task.config.sampling.temperature
        trajectory.allowed_token_ids = self.task.allowed_token_ids
        self.seed = seed  # env seed: shared by a GRPO group (same start state / prompt)
        self.sample_seed = sample_seed  # sampling seed: distinct per trajectory
        self._abort_reason: str | None = None
        self._current_request: str | None = None
        self._finished = False
        self._reward_request: RewardRequest | None = None  # set when the rollout completes
        self.env_id = self.pooled_env_id or trajectory.trajectory_id
        self.episodes += 1
        # Batched interaction: wait for the whole wave before each turn's generation.
        self.barrier = barrier
        if barrier is not None:
            barrier.join(self.env_id)
        # Launched ahead of its weights (sync mode's reset_ahead): held after the reset.
        self.gate = gate

    # ------------------------------------------------------------------ control
    async def abort(self, reason: str) -> bool:
        """End the trajectory: ABORT its in-flight request (in the engine too). False when
        it had already finished (scored or dropped) and the abort changes nothing."""
        if self._finished or self._abort_reason is not None:
            return False
        self._abort_reason = reason
        if self.barrier is not None:
            self.barrier.leave(self.env_id)
        if self.gate is not None:
            self.gate.leave(self.env_id)
        if self._current_request is not None:
            await self.proxy.abort(self._current_request)
        return True

    @property
    def aborted(self) -> bool:
        return self._abort_reason is not None

    # ------------------------------------------------------------------ life
    async def run(self) -> Trajectory:
        traj = self.traj
        try:
            await self._rollout()
            if self.barrier is not None:  # the wave does not wait for this one's reward
                self.barrier.leave(self.env_id)
            if self._abort_reason is None and traj.dropped is None:
                await self._score()
        except asyncio.CancelledError:
            traj.dropped = traj.dropped or f"aborted:{self._abort_reason or 'cancelled'}"
            raise
        finally:
            if self._abort_reason is not None and traj.dropped is None:
                traj.dropped = f"aborted:{self._abort_reason}"
            self._finished = True
            if self.barrier is not None:
                self.barrier.leave(self.env_id)
            self.proxy.release(traj.trajectory_id)
            if self.pooled_env_id is None:  # a pooled env is closed by its pool
                await self._close_env()
        return traj

    async def _close_env(self) -> None:
        """Close the env (in its own process); a failing close is recorded on the
        trajectory (``info["env_close_error"]``, logged to the run dir), never raised."""
        try:
            err = await wait_for(self.env_host.close(self.env_id), 20)
        except Exception as exc:  # noqa: BLE001 - recorded below; the result stands
            err = f"{type(exc).__name__}: {exc}"
        if err:
            self.traj.info["env_close_error"] = bounded(str(err))

    async def _timed(self, span: str, coro: Any, timeout: float, worker: str | None) -> Any:
        """Await ``coro`` with a timeout and record its span on the timeline; ``worker``
        None means "whoever served it" (read from the result)."""
        t0 = time.time()
        result: Any = None
        try:
            result = await wait_for(coro, timeout=timeout)
            return result
        finally:
            t1 = time.time()
            self.traj.timings.append((span, t0, t1))
            # worker None: whoever answered; "llm-proxy" when none did (aborted, timed out)
            who = worker if worker is not None else getattr(result, "worker", "") or "llm-proxy"
            self._emit({"trajectory": self.traj.trajectory_id, "tag": self.traj.tag,
                        "span": span, "worker": who, "t0": t0, "t1": t1})

    async def _reset(self) -> tuple[str, dict[str, Any]] | None:
        """The env's first observation; None (the trajectory dropped, with why) on failure."""
        traj, cfg = self.traj, self.task.config
        try:
            # The env worker kills a call past its timeout (the env's own process); the
            # caller's limit is a backstop for a worker that does not answer at all.
            obs, info = await self._timed(
                "env_reset",
                self.env_host.reset(self.env_id, traj.tag, self.seed, cfg.reset_timeout_s),
                cfg.reset_timeout_s + _BACKSTOP_S, self.env.name,
            )
        except Exception as exc:  # noqa: BLE001 - any env failure ends only this trajectory
            traj.dropped = _env_reason("reset", exc, cfg.reset_timeout_s)
            return None
        return obs, info

    async def _wait_for_weights(self) -> bool:
        """A trajectory launched ahead of its weights (``rollout.reset_ahead``) waits here,
        after its reset, until the engines serve the version it is for; its start version
        is then that one (it samples nothing before). False when aborted meanwhile."""
        if self.gate is not None and not self._abort_reason:
            await self.gate.wait(self.env_id)
            self.traj.start_version = self.version()
        self.gate = None
        return not self._abort_reason

    async def _generate(self, request: GenerationRequest) -> GenerationResult | None:
        """One turn's generation; None when it failed (``traj.dropped`` says why)."""
        traj, cfg = self.traj, self.task.config
        self._current_request = request.request_id
        try:
            result: GenerationResult = await self._timed(
                "generate", self.proxy.generate(request), cfg.generate_timeout_s, None
            )
            return result
        except TimeoutError:
            # The proxy's generate was cancelled: it sent ABORT to the engine itself.
            traj.dropped = f"generate_timeout: no response within {cfg.generate_timeout_s}s"
        except RequestKillsEngines as exc:  # not re-run: it would kill more engines
            traj.dropped = bounded(f"kills_engines: {exc}")
        except Exception as exc:  # noqa: BLE001 - e.g. the engine worker died
            traj.dropped = bounded(f"generate_failed: {type(exc).__name__}: {exc}")
        finally:
            self._current_request = None
        return None

    async def _rollout(self) -> None:
        traj, cfg = self.traj, self.task.config
        first = await self._reset()
        if first is None or not await self._wait_for_weights():
            return
        obs, info = first
        traj.info = info
        prompt_text = obs
        context = self.chat.first_prompt(obs, self.task.system_prompt)
        obs_ids = list(context)
        responses: list[str] = []
        for turn_index in range(cfg.max_turns):
            if self.barrier is not None:
                await self.barrier.arrive(self.env_id, turn_index)
            if self._abort_reason:
                return
            if len(context) >= cfg.max_context_tokens:
                traj.truncated = True
                traj.info["truncated_reason"] = "max_context_tokens"
                break
            request = GenerationRequest(
                request_id=f"{traj.trajectory_id}/t{turn_index}",
                prompt_ids=list(context),
                sampling=self.task.sampling(self.sample_seed * 1009 + turn_index),
                tag=traj.tag,
                trajectory_id=traj.trajectory_id,
            )
            result = await self._generate(request)
            if result is None:  # dropped with its reason
                return
            if result.finish_reason == "abort" or self._abort_reason:
                self._abort_reason = self._abort_reason or "engine"
                return
            text = self.chat.decode(result.token_ids)
            responses.append(text)
            traj.engine = traj.engine or result.worker
            turn = Turn(obs_ids=obs_ids, action_ids=list(result.token_ids),
                        logprobs=list(result.logprobs), versions=list(result.versions),
                        action_text=text)
            traj.turns.append(turn)
            context += turn.action_ids
            try:
                obs, reward, terminated, truncated, info = await self._timed(
                    "env_step", self.env_host.step(self.env_id, text, cfg.step_timeout_s),
                    cfg.step_timeout_s + _BACKSTOP_S, self.env.name,
                )
            except Exception as exc:  # noqa: BLE001 - any env failure ends only this trajectory
                traj.dropped = _env_reason("step", exc, cfg.step_timeout_s)
                return
            turn.env_reward = reward
            if isinstance(info, dict) and "invalid_action" in info:
                turn.invalid_action = bool(info["invalid_action"])
            traj.env_return += reward
            traj.info = info
            if terminated or truncated:
                traj.terminated, traj.truncated = terminated, truncated
                break
            obs_ids = self.chat.next_observation(obs, turn.action_ids)
            context += obs_ids
        else:
            traj.truncated = True
            traj.info["truncated_reason"] = "max_turns"
        if not traj.turns:
            traj.dropped = "no_turns: the context was full before the first action"
            return
        self._reward_request = RewardRequest(
            trajectory_id=traj.trajectory_id, tag=traj.tag, prompt=prompt_text,
            responses=responses, env_return=traj.env_return, terminated=traj.terminated,
            info=dict(traj.info),
        )

    async def _score(self) -> None:
        traj = self.traj
        assert self._reward_request is not None
        timeout = self.task.config.reward_timeout_s
        try:
            result = await self._timed(
                "reward", self.reward_host.score(traj.tag, self._reward_request),
                timeout, self.reward.name,
            )
        except TimeoutError:
            traj.dropped = f"reward_timeout: no reward within {timeout}s (tasks[].reward_timeout_s)"
            return
        except Exception as exc:  # noqa: BLE001 - recorded, not raised: others continue
            traj.dropped = bounded(f"reward_failed: {type(exc).__name__}: {exc}")
            return
        problem = _invalid_reward(result)
        if problem is not None:
            traj.dropped = bounded(
                f"reward_invalid: reward backend {self.task.config.reward.name!r} of task "
                f"{traj.tag!r} "
                f"{problem}; a backend's score returns a RewardResult whose reward is a "
                "finite number (check tasks[].reward and the backend)")
            return
        traj.reward = float(result.reward)
        traj.info["reward_details"] = result.details


def _invalid_reward(result: Any) -> str | None:
    """Why ``result`` is not a usable score (None: it is)."""
    try:
        reward = float(result.reward)
    except AttributeError:
        return f"returned {type(result).__name__} {str(result)[:100]!r}, not a RewardResult"
    except (TypeError, ValueError):
        return f"returned reward {str(result.reward)[:100]!r}, not a number"
    if not math.isfinite(reward):
        return f"returned reward {reward} (not finite)"
    return None
