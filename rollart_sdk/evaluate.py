"""``rollart eval CONFIG [--checkpoint DIR]``: a model's held-out evaluation, in one process.

The config's own backends (engine, env and reward plugins) are bound in this process the
way ``build_job(in_process=True)`` binds them (the same worker classes and spawn code), and
the episodes are run by :class:`~rollart_sdk.control.evaluation.Evaluator`, the code the
training pipeline's ``eval:`` uses. The weights: the config's model as built (no
``--checkpoint``), or a checkpoint of a run (``RUN/checkpoints/step-N``, or RUN for its
newest complete one), verified against its manifest, loaded by the config's trainer plugin
(its own checkpoint format) and pushed to the engines as a training run pushes a version
(publish -> stage -> commit). One process needs no cross-process weight transport: the
built-in ``local`` one carries the weights whatever ``transport:`` the config names.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rollart_sdk.config import Backend, EvalConfig, LineMap, RunConfig
from rollart_sdk.errors import RollartError


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path`` names (a ``step-N`` folder, or a run directory:
    its newest complete checkpoint), verified against its manifest. Raises with what is
    wrong and what to give instead."""
    from rollart_sdk.control import checkpoints

    p = Path(path)
    if not p.is_dir():
        raise RollartError(f"--checkpoint {path}: no such directory; give a checkpoint "
                           "folder (RUN/checkpoints/step-N) or a run directory")
    if (p / "checkpoints").is_dir():
        found = checkpoints.complete(p / "checkpoints")
        if not found:
            raise RollartError(f"--checkpoint {path}: the run has no complete checkpoint "
                               f"under {p / 'checkpoints'}")
        p = found[0].path
    elif not (p / checkpoints.RUN_STATE).is_file():
        raise RollartError(f"--checkpoint {path}: not a checkpoint (no {checkpoints.RUN_STATE}); "
                           "give RUN/checkpoints/step-N or a run directory")
    legacy = not (p / checkpoints.MANIFEST).is_file()
    why = checkpoints.verify(checkpoints.Checkpoint(p, 0, legacy=legacy))
    if why is not None:
        raise RollartError(f"--checkpoint {p}: {why}; evaluate another checkpoint of the run")
    return p


def eval_config(cfg: RunConfig, episodes: int | None, seed_offset: int | None) -> EvalConfig:
    """The config's ``eval:`` section (defaults where it has none), with the command
    line's ``--episodes`` / ``--seed-offset``."""
    base = cfg.eval or EvalConfig()
    update: dict[str, Any] = {}
    if episodes is not None:
        update["episodes"] = episodes
    if seed_offset is not None:
        update["seed_offset"] = seed_offset
    from pydantic import ValidationError

    try:
        return EvalConfig.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RollartError(f"--episodes / --seed-offset: {problems}") from None


def _model_mismatch(cfg: RunConfig, ckpt: Path) -> str | None:
    """A line when the checkpoint's run was configured with another model than ``cfg``."""
    import yaml

    run_cfg = ckpt.parent.parent / "config.yaml"
    if not run_cfg.is_file():
        return None
    try:
        theirs = (yaml.safe_load(run_cfg.read_text()) or {}).get("model")
    except (OSError, yaml.YAMLError):
        return None
    ours = cfg.model.model_dump(mode="json")
    if theirs is not None and theirs != ours:
        return (f"the checkpoint's run ({run_cfg}) has model {theirs}, the config {ours}; "
                "its trainer may fail to load it")
    return None


async def _load_weights(workers: Any, ckpt: Path, bucket_bytes: int, versions: Any,
                        proxy: Any) -> int:
    """The trainer loads ``ckpt``; its weights go to every engine (publish, stage,
    commit: what ``Pipeline.restore`` does). Returns the version loaded."""
    from rollart_sdk.weights import WeightSync

    trainers = [t.trainer for t in workers.trainers]
    await asyncio.gather(*(t.load_checkpoint(str(ckpt)) for t in trainers))
    version = await trainers[0].version()
    manifests = await asyncio.gather(*(t.publish_weights(bucket_bytes) for t in trainers))
    manifest = manifests[0]
    if manifest is None:
        raise RuntimeError(f"trainer rank 0 ({trainers[0].name}) published no manifest")
    sync = WeightSync(workers.engines + workers.prefill, proxy)
    manifest.meta.setdefault("receivers", len(sync.engines))
    await sync.stage(manifest)
    await sync.commit()
    versions.engine = version
    return version


def evaluate(cfg: RunConfig, lines: LineMap | None = None, checkpoint: str | None = None,
             episodes: int | None = None, seed_offset: int | None = None,
             log: Any = print, registry: Any = None) -> dict[str, Any]:
    """Evaluate the config's model (or ``checkpoint``) on held-out episodes of every task
    ``eval.tasks`` names; returns the result (what ``rollart eval --json`` prints)."""
    from rollart_sdk.cluster.roles import ROLE_WORKERS
    from rollart_sdk.cluster.spawn import LocalSpawner
    from rollart_sdk.config.resolve import resolve_run
    from rollart_sdk.job.preflight import preflight
    from rollart_sdk.job.spawn import spawn_workers
    from rollart_sdk.job.wire import task_runtimes
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.resources.plan import plan_resources
    from rollart_sdk.resources.threads import thread_plan

    ecfg = eval_config(cfg, episodes, seed_offset)
    ckpt = find_checkpoint(checkpoint) if checkpoint else None
    if ckpt is not None and (line := _model_mismatch(cfg, ckpt)):
        log(f"warning: {line}")
    cfg = cfg.model_copy(update={"transport": Backend(name="local"), "eval": ecfg})
    resolved = resolve_run(cfg, registry or get_plugins().registry, lines, in_process=True)
    plan = plan_resources(cfg, resolved, workers=ROLE_WORKERS)
    checked = preflight(cfg, resolved, lines, log, output_dir=False)
    tasks = task_runtimes(cfg, checked)  # before any worker: nothing after refuses the config
    log(f"model: {checked.model.path}")
    # One process, whose work is the engine's: torch gets the plan's in-process figure
    # (every core but the control loop's; ROLLART_TORCH_THREADS overrides it).
    plan_threads = thread_plan(cfg)
    threads: dict[str, Any] = {**plan_threads, "actor_gen": plan_threads["process"],
                               "actor_train": plan_threads["process"]}
    spawner = LocalSpawner(plan)
    t0 = time.perf_counter()
    try:
        workers = spawn_workers(cfg, resolved, plan, checked.model, spawner,
                                checked.described, threads, trainer=ckpt is not None)
        chat = tasks[cfg.tasks[0].tag].prompt_format
        result = asyncio.run(_run(cfg, ecfg, workers, tasks, chat, ckpt))
    finally:
        spawner.close()
    return {"config": cfg.name, "model": str(checked.model.path),
            "checkpoint": str(ckpt) if ckpt else None, **result,
            "wall_s": time.perf_counter() - t0}


async def _run(cfg: RunConfig, ecfg: EvalConfig, workers: Any, tasks: Any, chat: Any,
               ckpt: Path | None) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    from rollart_sdk.cluster.handles import EngineClient
    from rollart_sdk.control.evaluation import EVAL_SEED_BASE, Evaluator
    from rollart_sdk.control.proxy import LLMProxy
    from rollart_sdk.control.versions import PolicyVersions

    # Blocking calls of in-process workers run on the loop's executor (as in run_job).
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=ecfg.max_running + 16))
    proxy = LLMProxy(workers.engines, workers.routes, prefill_workers=workers.prefill)
    versions = PolicyVersions()
    version = 0
    try:
        if ckpt is not None:
            version = await _load_weights(workers, ckpt, int(cfg.train.bucket_mb * 2**20),
                                          versions, proxy)
        evaluator = Evaluator.build(cfg, ecfg, tasks, chat, proxy, workers.envs,
                                    workers.reward, versions.serving)
        results = await evaluator.run()
    finally:
        # Stop the engines here, on the loop (vLLM's and SGLang's engine cores, the LoRA
        # folders): left to the interpreter's exit, vLLM's AsyncLLM.__del__ printed a
        # TypeError traceback after every `rollart eval` on it.
        await asyncio.gather(*(EngineClient(h).shutdown()
                               for h in workers.engines + workers.prefill),
                             return_exceptions=True)
    first = EVAL_SEED_BASE + ecfg.seed_offset
    return {"version": version, "episodes": ecfg.episodes,
            "seeds": [first, first + ecfg.episodes - 1],
            "sampling": ecfg.sampling.model_dump(), "tasks": results}
