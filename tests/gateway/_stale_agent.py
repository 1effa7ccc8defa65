"""Agents for tests/gateway/test_stale_pipeline.py (imported by name by the env ``agent``).

The first group to run is *slow*: its agents keep calling the model until a request is
refused, so that they are still running when the staleness bound passes them; every other
episode makes one call and returns. What the slow agents' client raised is kept in
``ERRORS``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

SLOW: set[int] = set()
ERRORS: list[tuple[int, str]] = []
_LOCK = threading.Lock()
MESSAGES = [{"role": "user", "content": "Say something."}]


def reset() -> None:
    SLOW.clear()
    ERRORS.clear()


def task(seed: int) -> dict[str, Any]:
    return {"seed": seed}


async def run(client: Any, task: dict[str, Any]) -> float:
    import openai

    with _LOCK:  # the first episode to run picks its group's seed (not task: a preflight
        if not SLOW:  # may draw tasks)
            SLOW.add(task["seed"])
    if task["seed"] not in SLOW:
        reply = await client.chat.completions.create(model="policy", messages=MESSAGES,
                                                     max_tokens=4)
        return float(len(reply.choices[0].message.content or "") % 2)
    deadline = time.monotonic() + 120  # a bound: the test fails long before
    while time.monotonic() < deadline:
        try:
            await client.chat.completions.create(model="policy", messages=MESSAGES,
                                                 max_tokens=2)
        except openai.APIStatusError as exc:
            ERRORS.append((exc.status_code, exc.message))
            raise
        await asyncio.sleep(0.2)
    return 0.0
