"""``POST /v1/responses`` (OpenAI's Responses API, the Agents SDK's default model): the
translation into a chat turn, and the real ``openai`` client against the gateway on the
torch engine (a tiny model): the response and its stream parse as the client's own typed
objects, ``previous_response_id`` continues the episode's segment, log-probs are the
engine's, and what the gateway cannot honour is a 400 naming the field."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

openai = pytest.importorskip("openai")
rollart_engine_torch = pytest.importorskip("rollart_engine_torch.engine")

from gateway_parts import Rewards, SpyEngine  # noqa: E402

from rollart_sdk.cluster.envs.hosting import inline_handle  # noqa: E402
from rollart_sdk.config import ModelConfig, TaskConfig  # noqa: E402
from rollart_sdk.control.agent_manager import AgentManager  # noqa: E402
from rollart_sdk.control.chat import ChatFormat  # noqa: E402
from rollart_sdk.control.env_manager import TaskRuntime  # noqa: E402
from rollart_sdk.control.handles import WorkerHandle  # noqa: E402
from rollart_sdk.control.proxy import LLMProxy  # noqa: E402
from rollart_sdk.gateway import AgentEnv, Gateway  # noqa: E402
from rollart_sdk.gateway.episode import GatewayError  # noqa: E402
from rollart_sdk.gateway.responses_api import chat_request, input_messages  # noqa: E402
from rollart_sdk.models import load_tokenizer  # noqa: E402
from rollart_sdk.registry import Descriptor, NoOptions  # noqa: E402
from rollart_sdk.types import GenerationRequest, Trajectory  # noqa: E402

pytestmark = pytest.mark.timeout(300)
SEED = 2


def test_input_items_become_the_chat_messages_an_agent_would_send() -> None:
    """One model turn's output (a message and its calls) is one assistant message; a call
    without a message before it starts one; outputs are tool messages."""
    items = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "add",
         "arguments": '{"a": 2, "b": 3}', "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "5"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "0"}]},
        {"type": "function_call", "call_id": "call_c", "name": "add", "arguments": "{}"},
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
    ]
    assert input_messages(items) == [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "tool", "tool_call_id": "call_b", "content": "0"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_c", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
        {"role": "developer", "content": "Be brief."},
    ]
    chat, conversation = chat_request(
        {"model": "policy", "instructions": "You add.", "input": "hi", "max_output_tokens": 5,
         "tools": [{"type": "function", "name": "add", "description": "Add.",
                    "parameters": {"type": "object"}, "strict": True}],
         "tool_choice": {"type": "function", "name": "add"}, "temperature": 1.0,
         "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
         "extra_field_of_a_newer_sdk": 1},
        previous=[{"role": "user", "content": "before"}])
    assert chat == {
        "model": "policy", "temperature": 1.0, "max_completion_tokens": 5, "logprobs": True,
        "messages": [{"role": "system", "content": "You add."},
                     {"role": "user", "content": "before"}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {
            "name": "add", "description": "Add.", "parameters": {"type": "object"},
            "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "add"}}}
    assert conversation == chat["messages"][1:]  # instructions are not carried over


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"tools": [{"type": "web_search"}]}, "tools", "only function tools"),
    ({"text": {"format": {"type": "json_schema", "name": "A", "schema": {}}}}, "text.format",
     "ask for the format in the prompt"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "chat_template_kwargs"),
    ({"conversation": "conv_1"}, "conversation", "history as input"),
    ({"background": True}, "background", "await the response"),
    ({"top_logprobs": 3}, "top_logprobs", "sampled token's log-prob only"),
    ({"include": ["bogus.field"]}, "include", "message.output_text.logprobs"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0]", "only text parts"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "'reasoning'"),
    ({"input": [{"type": "function_call_output", "output": "5"}]}, "input[0]", "call_id"),
    ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice", "'required'"),
    ({"truncation": "middle"}, "truncation", "'auto' or 'disabled'"),
    ({"metadata": {"run": 1}}, "metadata", "object of strings"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(body: dict[str, Any], param: str,
                                                           says: str) -> None:
    with pytest.raises(GatewayError) as err:
        chat_request({"model": "policy", "input": "hi", **body}, None)
    assert err.value.status == 400 and err.value.param == param and says in err.value.message


def _serve(model: ModelConfig, talk: Any, seed: int = 1) -> Any:
    """Run ``talk(client, engine)`` against one open episode of a fresh gateway; returns
    ``(its result, the engine spy, the episode, the tokenizer)``."""
    async def main() -> Any:
        tok = load_tokenizer(model.path, light=True)
        engine = SpyEngine(model)
        cfg = TaskConfig(tag="agent", env={"name": "agent"}, max_turns=8,
                         sampling={"max_new_tokens": 8})
        gw = Gateway()
        await gw.start()
        task = TaskRuntime(cfg, None, None, ChatFormat(tok), gateway=gw)

        async def generate(ids: list[int], sampling: Any) -> Any:
            return await engine.generate(GenerationRequest(f"r{len(engine.results)}", ids,
                                                           sampling))

        # the episode's record as the AgentManager builds it (the task's template)
        host = inline_handle({"agent": (Descriptor(
            kind="env", name="agent", factory=AgentEnv, options=NoOptions, summary="",
            plugin="test"), NoOptions())}, on_loop=False)
        proxy = LLMProxy([WorkerHandle("gen0", engine, is_ray=False)], {"default": ["gen0"]})
        record = AgentManager(Trajectory("t", "agent", "g", 0), 1, 7, task,
                              task.prompt_format, proxy, host,
                              WorkerHandle("reward", Rewards(), is_ray=False),
                              version=lambda: 0)._record()
        ep = gw.open("e", record=record, generate=generate, sampling=task.sampling(seed),
                     max_turns=8, max_context_tokens=1024, stop_ids={tok.eos_token_id},
                     decode_text=task.prompt_format.decode)
        client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.token, max_retries=0)
        try:
            out = await talk(client, engine)
        finally:
            await client.close()
            await gw.stop()
        return out, engine, ep, tok

    return asyncio.run(main())


def test_openai_client_responses_continue_the_segment_and_carry_the_engines_answer(
        model: ModelConfig) -> None:
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    async def talk(client: Any, engine: Any) -> Any:
        first = await client.responses.create(model="policy", instructions="You count.",
                                              input="count to 3",
                                              include=["message.output_text.logprobs"])
        # instructions are not carried over by previous_response_id (OpenAI's rule)
        second = await client.responses.create(model="policy", instructions="You count.",
                                               input="go on", previous_response_id=first.id)
        await client.responses.create(model="policy", input="go on",
                                             previous_response_id=first.id)
        # the same turn again, the history sent as items (what the Agents SDK does)
        history = [{"role": "user", "content": "count to 3"},
                   *[item.model_dump(exclude_none=True) for item in first.output],
                   {"role": "user", "content": "go on"}]
        again = await client.responses.create(model="policy", instructions="You count.",
                                              input=history)
        stream = await client.responses.create(model="policy", input="hi", stream=True)
        events = [e async for e in stream]
        with pytest.raises(openai.BadRequestError, match="previous response"):
            await client.responses.create(model="policy", input="x",
                                          previous_response_id="resp_unknown")
        return first, second, again, events

    # SEED: the tiny model samples no special token here (the returned text drops them,
    # so a history holding one would not render as sampled: seed 1 does)
    (first, second, again, events), engine, ep, tok = _serve(model, talk, seed=SEED)
    for r in (first, second, again):  # the client's own model, validated strictly
        Response.model_validate(r.model_dump())
    r0 = engine.results[0]
    text = tok.decode([i for i in r0.token_ids if i not in ep.stop_ids],
                      skip_special_tokens=True)
    assert first.output_text == text and first.status in ("completed", "incomplete")
    assert first.usage.output_tokens == len(r0.token_ids)
    assert first.usage.input_tokens == len(engine.prompts[0])
    assert [lp.logprob for lp in first.output[0].content[0].logprobs] == r0.logprobs
    # previous_response_id: the second prompt extends the first prompt and its sampled
    # tokens, one segment; the history sent as items renders to the same prompt
    assert engine.prompts[1][:len(engine.prompts[0]) + len(r0.token_ids)] == \
        engine.prompts[0] + list(r0.token_ids)
    system = tok.decode(engine.prompts[0], skip_special_tokens=False)
    assert "You count." in system
    assert "You count." not in tok.decode(engine.prompts[2], skip_special_tokens=False)
    assert engine.prompts[3] == engine.prompts[1]
    assert len(ep.record.segments[0].turns) >= 2
    # the stream: the API's typed events, numbered, ending in the whole response
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",
                                                            "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for e in events:
        TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump())
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == len(engine.results[-1].token_ids)
    assert ep.counts["refused_400"] == 1



def test_a_reply_cut_by_the_token_limit_is_trained_with_reward_0_not_dropped(
        model: ModelConfig) -> None:
    """The Agents SDK's Responses model raises ``ModelBehaviorError`` on an incomplete
    response (a reply cut by ``max_output_tokens``, as OpenAI and vLLM report it). Env
    ``calc_agent`` scores that 0 through ``AgentEnv.on_error``: the episode is trained on,
    its cut reply included, instead of dropped (a failure of the model's own that the
    policy would never learn from)."""
    from pathlib import Path

    from gateway_parts import run_episode

    pytest.importorskip("agents")
    from rollart_env_calc_agent.env import CalcAgentEnv, CalcAgentOptions

    template = (Path(__file__).resolve().parents[2] / "examples" / "templates"
                / "tiny_tools.jinja").read_text()
    descriptor = Descriptor(kind="env", name="calc_agent", factory=CalcAgentEnv,
                            options=CalcAgentOptions, summary="", plugin="test")
    options = CalcAgentOptions(api="responses", max_tokens=3, follow_ups=0)
    tok, engine, traj, ep = run_episode(model, template, descriptor, options, 1.0)
    assert traj.dropped is None and traj.reward == 0.0
    assert traj.info["agent_error"].startswith("ModelBehaviorError: Responses stream ended "
                                               "with terminal event `response.incomplete`")
    assert len(engine.results) == 1 and engine.results[0].finish_reason == "length"
    assert traj.turns[-1].action_ids == engine.results[0].token_ids  # the cut reply, trained


@pytest.mark.parametrize("scored", [True, False])
def test_the_agent_envs_error_rewards_score_a_named_exception(model: ModelConfig,
                                                              scored: bool) -> None:
    """Env ``agent`` (a plain function): ``error_rewards`` names the exceptions that score
    the episode (trained, its one turn included) instead of dropping it."""
    from gateway_parts import run_episode

    from rollart_sdk.gateway.agent import ImportedAgent, ImportedAgentOptions

    options = ImportedAgentOptions(run="_error_agent:run", tasks="_error_agent:task",
                                   error_rewards={"ModelBehaviorError": -0.5} if scored else {})
    descriptor = Descriptor(kind="env", name="agent", factory=ImportedAgent,
                            options=ImportedAgentOptions, summary="", plugin="test")
    tok, engine, traj, ep = run_episode(model, None, descriptor, options, 1.0)
    assert len(engine.results) == 1
    if scored:
        assert traj.dropped is None and traj.reward == -0.5
        assert traj.info["agent_error"] == ("ModelBehaviorError: the reply was cut by the "
                                            "token limit")
        assert traj.turns[0].action_ids == engine.results[0].token_ids
    else:
        assert traj.dropped is not None and "ModelBehaviorError" in traj.dropped
    with pytest.raises(ValueError, match="finite"):
        ImportedAgentOptions(run="m:f", tasks="m:t", error_rewards={"E": float("nan")})
