"""An agent for tests/gateway/test_agent_eval.py that asks for its own temperature (0.7),
as framework agents often do (smolagents' ``temperature=``, LangChain's ``ChatOpenAI``)."""

from __future__ import annotations

from typing import Any


def task(seed: int) -> dict[str, Any]:
    return {"seed": seed}


async def run(client: Any, task: dict[str, Any]) -> float:
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Say something."}],
        max_tokens=4, temperature=0.7)
    return float(len(reply.choices[0].message.content or "") % 2)
