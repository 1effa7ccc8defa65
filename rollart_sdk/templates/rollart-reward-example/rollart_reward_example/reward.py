"""Reward ``example``: scores one finished trajectory (``async score``).

Replace the scoring rule with yours; ``tests/test_example.py`` runs rollart's conformance
kit (``check_reward``). ``score`` may call remote services: it is awaited, concurrently.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import RewardRequest, RewardResult


class ExampleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    success_bonus: float = Field(1.0, description="added when info['success'] is true")
    use_env_return: bool = Field(True, description="start from the environment's return")


class ExampleReward:
    def __init__(self, success_bonus: float = 1.0, use_env_return: bool = True) -> None:
        self.success_bonus = success_bonus
        self.use_env_return = use_env_return

    async def score(self, request: RewardRequest) -> RewardResult:
        reward = float(request.env_return) if self.use_env_return else 0.0
        success = bool(request.info.get("success"))
        if success:
            reward += self.success_bonus
        return RewardResult(request.trajectory_id, reward, {"success": success})
