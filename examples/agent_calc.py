"""A tool-using agent written against the OpenAI API, trained as a rollart task.

Nothing here knows about rollart but the model name: ``run`` is a plain ``openai`` loop
(chat completions with a calculator tool) that the gateway serves from the run's engines.
``examples/agent_calc.yaml`` selects it with the built-in env ``agent``; docs/gateway.md
walks through it.
"""

from __future__ import annotations

import json
import random
from typing import Any

MODEL = "policy"  # the gateway's name for the policy being trained
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
SYSTEM = ("You can call the add tool. When you know the result, reply with the number "
          "only.")


def task(seed: int) -> dict[str, Any]:
    """The episode's task: a GRPO group shares a seed, hence a question."""
    rng = random.Random(seed)
    a, b = rng.randint(0, 4), rng.randint(0, 4)
    return {"question": f"What is {a} + {b}?", "answer": str(a + b)}


def _add(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) + int(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


async def run(client: Any, task: dict[str, Any]) -> str:
    """Ask, run tool calls, ask again; the final reply is the answer (scored by the task's
    reward backend against ``task["answer"]``)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": task["question"]}]
    for _ in range(3):
        reply = await client.chat.completions.create(model=MODEL, messages=messages,
                                                     tools=TOOLS, max_tokens=16)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": _add(call.function.arguments)})
    return ""
