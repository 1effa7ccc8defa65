"""What the gateway tests put around the gateway: the torch engine with a spy on what it
got and generated, a reward that passes the agent's own on, and a gateway that keeps the
episodes it closed (their records and counts); the config of a whole-pipeline agent run."""

from __future__ import annotations

from typing import Any

from rollart_sdk.config import ModelConfig
from rollart_sdk.gateway import Gateway
from rollart_sdk.types import RewardResult


class SpyEngine:
    """The torch engine, keeping each prompt it got and each result it returned."""

    def __init__(self, model: ModelConfig, max_running: int = 8, max_seq_len: int = 1024) -> None:
        from rollart_engine_torch.engine import TorchEngine

        self.engine = TorchEngine(model=model, max_running=max_running, max_seq_len=max_seq_len)
        self.prompts: list[list[int]] = []
        self.results: list[Any] = []

    async def generate(self, request: Any, kv: Any = None) -> Any:
        self.prompts.append(list(request.prompt_ids))
        result = await self.engine.generate(request)
        self.results.append(result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class Rewards:
    """The agent's own reward (``env_return``) as the task's."""

    async def score(self, tag: str, request: Any) -> RewardResult:
        return RewardResult(request.trajectory_id, request.env_return)


class KeepingGateway(Gateway):
    """Keeps closed episodes, to compare the recorded prompts with the agent's messages."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Any] = []

    def close(self, episode_id: str, reason: str = "closed") -> Any:
        ep = super().close(episode_id, reason)
        self.kept.append(ep)
        return ep


def run_episode(model: ModelConfig, template: str, descriptor: Any, options: Any,
                temperature: float, seed: int = 1,
                step_timeout_s: float = 600, max_turns: int = 6
                ) -> tuple[Any, SpyEngine, Any, Any]:
    """One agent episode of env ``descriptor`` (with ``options``) on ``model`` behind a
    :class:`KeepingGateway`, run by the AgentManager on the torch engine through the
    LLMProxy with chat template ``template`` (its text): ``(tokenizer, engine, trajectory,
    the closed episode)``."""
    import asyncio

    from rollart_sdk.cluster.envs.hosting import inline_handle
    from rollart_sdk.config import TaskConfig
    from rollart_sdk.control.agent_manager import AgentManager
    from rollart_sdk.control.chat import ChatFormat
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.control.handles import WorkerHandle
    from rollart_sdk.control.proxy import LLMProxy
    from rollart_sdk.models import load_tokenizer
    from rollart_sdk.types import Trajectory

    async def main() -> tuple[Any, SpyEngine, Any, Any]:
        tok = load_tokenizer(model.path, light=True)
        chat = ChatFormat(tok, template=template)
        engine = SpyEngine(model, max_running=4, max_seq_len=2048)
        proxy = LLMProxy([WorkerHandle("gen0", engine, is_ray=False)], {"default": ["gen0"]})
        cfg = TaskConfig(tag="calc", env={"name": descriptor.name}, max_turns=max_turns,
                         max_context_tokens=2048, step_timeout_s=step_timeout_s,
                         sampling={"max_new_tokens": 32, "temperature": temperature})
        gw = KeepingGateway()
        task = TaskRuntime(cfg, None, None, chat, gateway=gw)
        host = inline_handle({"calc": (descriptor, options)}, on_loop=False)
        reward = WorkerHandle("reward", Rewards(), is_ray=False)
        mgr = AgentManager(Trajectory("traj-0", "calc", "g0", 0), seed, seed, task,
                           task.prompt_format, proxy, host, reward, version=lambda: 0)
        traj = await mgr.run()
        await gw.stop()
        return tok, engine, traj, gw.kept[0]

    return asyncio.run(main())


def agent_config(name: str, module: str, *, max_turns: int, max_new_tokens: int,
                 rollout: dict[str, Any], train: dict[str, Any]) -> dict[str, Any]:
    """A whole-pipeline run config (tiny model, in process) of one task whose env is the
    built-in ``agent`` with ``module``'s ``run`` and ``task`` (a module in this folder)."""
    return {
        "name": name, "seed": 0,
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                           "intermediate_size": 64, "seed": 0}},
        "tasks": [{"tag": "calc", "env": {"name": "agent", "options": {
            "run": f"{module}:run", "tasks": f"{module}:task"}},
            "reward": {"name": "rule", "options": {"mode": "env_return"}},
            "max_turns": max_turns, "max_context_tokens": 512, "step_timeout_s": 300,
            "env_host": "thread", "sampling": {"max_new_tokens": max_new_tokens}}],
        "engine": {"name": "torch", "options": {"max_running": 16}},
        "trainer": {"name": "torch", "options": {"lr": 0.001, "micro_batch_size": 8}},
        "transport": {"name": "local"},
        "rollout": rollout,
        "train": train,
    }


def run_config(config: dict[str, Any], out: Any, steps: int) -> tuple[Any, list[Any], Any]:
    """Run ``config`` in process for ``steps`` under folder ``out``: the (closed) job, the
    step records and the run directory."""
    import yaml

    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job

    path = out / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump({**config, "output_dir": str(out / "runs")}))
    cfg, lines = load_config(path)
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        records = run_job(job, steps, progress=False)
    finally:
        job.close()
    (run_dir,) = [d for d in (out / "runs").iterdir()
                  if d.is_dir() and not d.name.startswith(".")]
    return job, records, run_dir
