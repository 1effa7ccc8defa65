"""Held-out evaluation: episodes rolled out by the training rollout's own code, never trained.

Each episode is one :class:`~rollart_sdk.control.env_manager.EnvManager` run, exactly as
the scheduler runs a training trajectory (reset -> generate through the LLMProxy ->
env.step ... -> reward backend), with three differences:

- **held-out env seeds**: training draws a group's env seed as
  ``Random(f"{run seed}/env/{k}").randrange(2**31)``, so every training seed of every run
  lies in ``[0, 2**31)``; evaluation episode ``i`` gets ``2**31 + seed_offset + i``,
  outside that range for any run seed (and below ``2**32``, which numpy's legacy seeding
  accepts). The set is the same for every run and every checkpoint, so numbers compare.
  A held-out *seed* is a held-out *problem* only where the env's problem space is large:
  one-digit arithmetic has 100 questions, all of which training sees;
- **eval sampling** (``eval.sampling``): greedy by default; the sampling seed of episode
  ``i`` is ``i`` (it matters only when the temperature is above 0);
- **never trained**: the episodes go to no SampleBuffer and no scheduler, so they are not
  launched, trained or dropped in the run's accounting, and no trainer sees them. Their
  trajectory ids start with ``eval:``; their requests go through the same proxy and
  engines (counted in the proxy's per-engine ``served`` figures like any request).

Figures per task: success rate (episodes whose env reports ``success``) with a Wilson 95 %
interval, mean reward and mean turns with a 95 % interval (:func:`mean_ci`: Wilson's when
every value is 0 or 1, else a seeded percentile bootstrap, so an interval never leaves the
values' range: 4 episodes of 0/1 rewards gave [-0.24, 0.74] under the normal
approximation); dropped episodes (a failing env or engine) are counted apart and left out
of the means.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, replace
from typing import Any

from rollart_sdk.cluster.handles import WorkerHandle
from rollart_sdk.config import EvalConfig, RunConfig
from rollart_sdk.control.chat import ChatFormat
from rollart_sdk.control.env_manager import EnvManager, TaskRuntime
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.types import Trajectory

EVAL_SEED_BASE = 2**31  # training env seeds are below it (scheduler._keyed_seed)
Z95 = 1.959963984540054


def eval_seed(index: int, offset: int = 0) -> int:
    """The env seed of held-out episode ``index`` (see the module doc)."""
    return EVAL_SEED_BASE + offset + index


def eval_runtime(task: TaskRuntime, cfg: EvalConfig) -> TaskRuntime:
    """``task`` with the eval sampling settings in place of its training ones."""
    s = cfg.sampling
    sampling = task.config.sampling.model_copy(update={
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
        "max_new_tokens": s.max_new_tokens or task.config.sampling.max_new_tokens})
    return replace(task, config=task.config.model_copy(update={"sampling": sampling}),
                   evaluation=True)


BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_MAX_N = 400  # more values: the normal interval (it fits by then, and costs O(n))


def mean_ci(xs: list[float], counts: bool = False) -> tuple[float | None, list[float] | None]:
    """Mean and a 95 % interval for it (None with fewer than 2 values): Wilson's when every
    value is 0 or 1 (a success-like reward; not for ``counts``, e.g. turns, where all ones
    is no proportion), else the 2.5 and 97.5 percentiles of
    :data:`BOOTSTRAP_DRAWS` resampled means (a fixed seed: the same episodes give the same
    interval). Neither reaches outside what the values can be, as ``mean +- 1.96 sd /
    sqrt(n)`` does with few episodes; above :data:`BOOTSTRAP_MAX_N` values it is that
    normal interval."""
    if not xs:
        return None, None
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, None
    if not counts and all(x in (0.0, 1.0) for x in xs):
        return m, wilson(round(sum(xs)), n)
    if min(xs) == max(xs):
        return m, [m, m]
    if n > BOOTSTRAP_MAX_N:  # the normal approximation is as good, and O(n)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
        return m, [m - Z95 * sd / math.sqrt(n), m + Z95 * sd / math.sqrt(n)]
    draws = random.Random(0)
    means = sorted(sum(draws.choices(xs, k=n)) / n for _ in range(BOOTSTRAP_DRAWS))
    return m, [means[int(0.025 * BOOTSTRAP_DRAWS)], means[int(0.975 * BOOTSTRAP_DRAWS) - 1]]


def wilson(k: int, n: int) -> list[float] | None:
    """Wilson score 95 % interval of a proportion ``k / n``."""
    if n == 0:
        return None
    p, z2 = k / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def summarize(trajs: list[Trajectory]) -> dict[str, Any]:
    """One task's figures (see the module doc)."""
    done = [t for t in trajs if t.dropped is None]
    succ = [bool(t.info["success"]) for t in done if "success" in t.info]
    reward, reward_ci = mean_ci([float(t.reward or 0.0) for t in done])
    turns, turns_ci = mean_ci([float(len(t.turns)) for t in done], counts=True)
    drops: dict[str, int] = {}
    for t in trajs:
        if t.dropped is not None:
            why = t.dropped.split(":", 1)[0]
            drops[why] = drops.get(why, 0) + 1
    return {
        "episodes": len(trajs), "completed": len(done), "dropped": drops,
        "success": sum(succ) / len(succ) if succ else None,
        "success_ci": wilson(sum(succ), len(succ)),
        "reward": reward, "reward_ci": reward_ci, "turns": turns, "turns_ci": turns_ci,
        "versions": sorted({v for t in done for v in t.versions}),
    }


def sign_test(gained: int, lost: int) -> float:
    """Exact two-sided sign test: the chance of a split at least this uneven between
    ``gained`` and ``lost`` episodes if either were equally likely."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(base: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    """Two evaluations' episodes matched by env seed (``per_episode`` of each): how many
    the new one solves that the baseline did not (``gained``) and the reverse (``lost``),
    with the sign test's p. Same seeds, so the problems are the same: a far more
    sensitive comparison than two overlapping intervals."""
    before = {e["seed"]: e["success"] for e in base if e.get("success") is not None}
    pairs = [(before[e["seed"]], e["success"]) for e in new
             if e.get("success") is not None and e["seed"] in before]
    gained = sum(1 for b, n in pairs if n and not b)
    lost = sum(1 for b, n in pairs if b and not n)
    return {"paired": len(pairs), "gained": gained, "lost": lost,
            "sign_test_p": sign_test(gained, lost)}


def episode_record(t: Trajectory, seed: int) -> dict[str, Any]:
    """One episode as the JSON result lists it: seed, outcome and the model's actions."""
    return {"seed": seed, "reward": t.reward, "success": t.info.get("success"),
            "turns": len(t.turns), "dropped": t.dropped,
            "actions": [turn.action_text[:200] for turn in t.turns]}


def metric_line(results: dict[str, dict[str, Any]], step: int, seconds: float) -> dict[str, Any]:
    """The ``metrics.jsonl`` line of one evaluation after ``step`` steps trained."""
    line: dict[str, Any] = {"step": step, "kind": "eval", "eval/seconds": seconds}
    for tag, r in results.items():
        for key in ("success", "reward", "turns"):
            line[f"eval/{tag}/{key}"] = r[key]
            ci = r[f"{key}_ci"]
            line[f"eval/{tag}/{key}_lo"], line[f"eval/{tag}/{key}_hi"] = ci or (None, None)
        line[f"eval/{tag}/episodes"] = r["completed"]
        line[f"eval/{tag}/dropped"] = sum(r["dropped"].values())
        line[f"eval/{tag}/version"] = max(r["versions"]) if r["versions"] else None
    return line


@dataclass
class Evaluator:
    """Rolls out the held-out episodes of ``tags`` through ``proxy`` (the engines), the
    tasks' env hosts and the reward handle: the pieces a job wired for training."""

    cfg: EvalConfig
    tasks: dict[str, TaskRuntime]  # eval sampling applied
    chat: ChatFormat
    proxy: LLMProxy
    envs: dict[str, list[WorkerHandle]]
    reward: WorkerHandle
    version: Any  # () -> the version the engines serve
    runs: int = 0  # evaluations done (their trajectory ids differ)

    @classmethod
    def build(cls, run: RunConfig, cfg: EvalConfig, tasks: dict[str, TaskRuntime],
              chat: ChatFormat, proxy: LLMProxy, envs: dict[str, list[WorkerHandle]],
              reward: WorkerHandle, version: Any) -> Evaluator:
        tags = cfg.tasks or [t.tag for t in run.tasks]
        return cls(cfg, {tag: eval_runtime(tasks[tag], cfg) for tag in tags}, chat, proxy,
                   envs, reward, version)

    async def run(self) -> dict[str, dict[str, Any]]:
        """Every task's episodes (at most ``cfg.max_running`` at once); per task its
        figures (:func:`summarize`) and ``seconds``."""
        self.runs += 1
        gate = asyncio.Semaphore(self.cfg.max_running)
        out: dict[str, dict[str, Any]] = {}
        for tag in self.tasks:
            t0 = time.perf_counter()
            trajs = await asyncio.gather(*(self._episode(tag, i, gate)
                                           for i in range(self.cfg.episodes)))
            out[tag] = {**summarize(list(trajs)), "seconds": time.perf_counter() - t0,
                        "per_episode": [episode_record(t, eval_seed(i, self.cfg.seed_offset))
                                        for i, t in enumerate(trajs)]}
        return out

    async def _episode(self, tag: str, i: int, gate: asyncio.Semaphore) -> Trajectory:
        async with gate:
            hosts = self.envs[tag]
            traj = Trajectory(trajectory_id=f"eval:{self.runs}:{tag}:{i}", tag=tag,
                              group_id=f"eval:{self.runs}:{tag}", start_version=self.version())
            manager = EnvManager
            if self.tasks[tag].gateway is not None:  # an agent task: the agent drives
                from rollart_sdk.control.agent_manager import AgentManager

                manager = AgentManager
            mgr = manager(traj, eval_seed(i, self.cfg.seed_offset), i, self.tasks[tag],
                          self.chat, self.proxy, hosts[i % len(hosts)], self.reward,
                          self.version)
            return await mgr.run()
