"""An agent for tests/gateway/test_segments_pipeline.py (imported by name by the env
``agent``): it asks, then replaces its history with a summary of the reply and asks again
(a summarising agent), so every episode is two segments."""

from __future__ import annotations

from typing import Any


def task(seed: int) -> dict[str, Any]:
    return {"seed": seed}


async def run(client: Any, task: dict[str, Any]) -> float:
    first = [{"role": "user", "content": f"Say something about {task['seed']}."}]
    a = await client.chat.completions.create(model="policy", messages=first, max_tokens=5)
    again = [{"role": "user", "content": "Summary so far: " + (a.choices[0].message.content or "")
              + ". Go on."}]
    b = await client.chat.completions.create(model="policy", messages=again, max_tokens=5)
    # A reward that differs within a group (the random model's replies differ).
    return float(len(b.choices[0].message.content or "") % 2)
