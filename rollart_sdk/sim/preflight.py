"""The checks of a simulated run (``clock: simulated``) before it starts, beside the sim
(:mod:`rollart_sdk.job.preflight` has the real run's): ``check_sim_context``, each task's
first prompt (the sim env's first observation, seed 0, in the sim's token ids,
``sim.token_block``) against the task's budget in those ids and against the KV cache of
the engines that serve the task (the sim engine finishes a prompt that does not fit with
no tokens), and ``sim_preflight``, that, ``check_output_dir`` and ``check_env_pools`` as
one ConfigError.
"""

from __future__ import annotations

from typing import Any

from rollart_sdk.config import RunConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.job.env_probe import Problems, built_first_observations
from rollart_sdk.job.preflight import _at, check_env_pools, check_output_dir
from rollart_sdk.sim.backends import SimFormat
from rollart_sdk.sim.costs import resolve_hardware
from rollart_sdk.sim.engine import SimEngine


def check_sim_context(cfg: RunConfig, resolved: Any, plan: Any) -> tuple[Problems, list[str]]:
    """``(problems, warnings)`` of a simulated run's context budgets: each task's first
    prompt (the sim env's first observation, seed 0, in the sim's token ids: one id per
    ``sim.token_block`` tokens) against ``max_context_tokens`` in those ids (what the
    EnvManager compares), and against the KV cache of the engines that serve the task
    (a sim engine finishes a prompt larger than its KV cache with no tokens)."""
    block = cfg.sim.token_block
    fmt = SimFormat(block)
    try:
        spec = cfg.sim.model_spec()
    except ValueError as exc:
        return [("sim", str(exc))], []
    engine_pools = list(plan.role("actor_gen").workers_per_pool)
    problems: Problems = []
    warnings: list[str] = []
    capacity: dict[str, int] = {}  # engine pool -> KV tokens of an engine there
    for pool in engine_pools:
        hw = cfg.pool(pool).hardware
        try:
            engine = SimEngine(**resolved.engine.options.model_dump(),
                               hardware=resolve_hardware(hw, cfg.sim.hardware),
                               model_spec=spec, hardware_name=hw, response_tokens={},
                               token_block=block)
        except ValueError as exc:  # the model does not fit the pool's devices
            problems.append((f"pools ({pool})", str(exc)))
            continue
        capacity[pool] = int(engine.capacity)
    for i, task, obs in built_first_observations(cfg, resolved.envs, warnings):
        ids = len(fmt.first_prompt(str(obs)))
        budget = max(1, task.max_context_tokens // block)
        if ids >= budget:
            problems.append((f"tasks.{i}.max_context_tokens", (
                f"{task.max_context_tokens} tokens ({budget} ids of sim.token_block={block}) "
                f"cannot hold task {task.tag!r}'s first prompt ({ids * block} tokens, {ids} "
                "ids: the sim env's first observation, seed 0), so every trajectory would be "
                "dropped (no_turns); raise it to at least "
                f"{max((ids + 1) * block, ids * block + task.sampling.max_new_tokens)} "
                "(prompt + sampling.max_new_tokens)")))
        pools = [p for p in engine_pools if task.affinity in (p, cfg.pool(p).hardware)]
        caps = [capacity[p] for p in (pools or engine_pools) if p in capacity]
        if caps and ids * block >= max(caps):
            problems.append((f"tasks.{i}.env.options.first_obs_tokens", (
                f"task {task.tag!r}'s first prompt ({ids * block} tokens) does not fit the "
                f"KV cache of any engine serving it ({max(caps)} tokens on "
                f"{', '.join(pools or engine_pools)}), so every request would end with no "
                "tokens; give the engines more devices (engine.options.devices) or memory "
                "(sim.hardware), or a smaller first_obs_tokens")))
    return problems, warnings


def sim_preflight(cfg: RunConfig, resolved: Any, plan: Any, lines: Any = None,
                  log: Any = print) -> None:
    """``check_output_dir``, ``check_env_pools`` and ``check_sim_context`` for a
    simulated run, as one ConfigError (with the config's lines)."""
    problems, warnings = check_sim_context(cfg, resolved, plan)
    for w in warnings:
        log(f"warning: {w}")
    problems = check_output_dir(cfg.output_dir) + check_env_pools(cfg) + problems
    if problems:
        raise ConfigError([(_at(w, lines), m) for w, m in problems])
