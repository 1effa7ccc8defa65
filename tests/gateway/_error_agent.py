"""An agent for tests/gateway/test_responses_api.py whose framework gives up after its
first model call, as the Agents SDK does on a reply it refuses (``ModelBehaviorError``)."""

from __future__ import annotations

from typing import Any


class ModelBehaviorError(RuntimeError):
    """Named as the Agents SDK's (``agents.exceptions.ModelBehaviorError``)."""


def task(seed: int) -> dict[str, Any]:
    return {"seed": seed}


async def run(client: Any, task: dict[str, Any]) -> float:
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Say something."}], max_tokens=4)
    raise ModelBehaviorError("the reply was cut by the token limit")
