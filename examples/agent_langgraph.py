"""A LangGraph agent (its prebuilt ReAct agent over LangChain's ``ChatOpenAI``, unmodified
from PyPI) trained as a rollart task: ``examples/agent_langgraph.yaml`` selects it with
the built-in env ``agent``, with the questions of ``examples/agent_calc.py``. The only
rollart-specific line gives ``ChatOpenAI`` the episode client's base URL and key
(docs/gateway.md). Needs the ``agent-frameworks``
extra (``bash scripts/install.sh --dev``, or ``pip install langgraph langchain-openai``).
"""

from __future__ import annotations

import warnings
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

with warnings.catch_warnings():  # moved to langchain.agents in LangGraph 1.0
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run(client: Any, task: dict[str, Any]) -> str:
    """The agent's final message is the answer (scored against ``task["answer"]``)."""
    llm = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key,
                     max_tokens=32, max_retries=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(llm, [add])
    out = await agent.ainvoke({"messages": [("user", task["question"])]},
                              {"recursion_limit": 5})
    return str(out["messages"][-1].content).strip()
