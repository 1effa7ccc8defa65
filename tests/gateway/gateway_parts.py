"""What the gateway tests put around the gateway: the torch engine with a spy on what it
got and generated, a reward that passes the agent's own on, and a gateway that keeps the
episodes it closed (their records and counts)."""

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
