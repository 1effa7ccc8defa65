"""Reward ``closeness``: 1 for a solved episode, partial credit for a near last guess."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import RewardRequest, RewardResult


class ClosenessOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    partial: float = Field(0.5, ge=0, le=1, description=(
        "the most an unsolved episode earns: partial * (1 - distance / high) of the last guess"))


class ClosenessReward:
    def __init__(self, partial: float = 0.5) -> None:
        self.partial = partial

    async def score(self, request: RewardRequest) -> RewardResult:
        info = request.info  # the last step's info
        if info.get("success"):
            return RewardResult(request.trajectory_id, 1.0, {"success": True})
        high = max(1, int(info.get("high", 1)))
        distance = min(high, int(info.get("distance", high)))
        reward = self.partial * (1 - distance / high)
        return RewardResult(request.trajectory_id, reward,
                            {"success": False, "distance": distance, "turns": len(request.responses)})
