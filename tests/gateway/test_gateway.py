"""The OpenAI-compatible gateway, driven by the real ``openai`` client, backed by the torch
engine on a tiny model through the LLMProxy, with agents run by the AgentManager on a
thread env host (the control plane's real path; no mocks but a spy on the engine's
answers)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")
rollart_engine_torch = pytest.importorskip("rollart_engine_torch.engine")

from gateway_parts import KeepingGateway, Rewards, SpyEngine  # noqa: E402

from rollart_sdk.cluster.envs.hosting import inline_handle  # noqa: E402
from rollart_sdk.config import ModelConfig, TaskConfig  # noqa: E402
from rollart_sdk.control.agent_manager import AgentManager  # noqa: E402
from rollart_sdk.control.chat import ChatFormat  # noqa: E402
from rollart_sdk.control.env_manager import TaskRuntime  # noqa: E402
from rollart_sdk.control.handles import WorkerHandle  # noqa: E402
from rollart_sdk.control.proxy import LLMProxy  # noqa: E402
from rollart_sdk.gateway import AgentEnv, AgentResult, Gateway  # noqa: E402
from rollart_sdk.models import load_tokenizer  # noqa: E402
from rollart_sdk.registry import Descriptor, NoOptions  # noqa: E402
from rollart_sdk.types import Trajectory  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class ThreeTurns(AgentEnv):
    """Three turns, each appending the model's reply and a new user message."""

    def task(self, seed: int) -> Any:
        return {"question": f"count to {seed % 5}", "answer": "0"}

    async def run(self, client: Any, task: Any) -> AgentResult:
        messages = [{"role": "system", "content": "You count."},
                    {"role": "user", "content": task["question"]}]
        for i in range(3):
            reply = await client.chat.completions.create(model=self.model, messages=messages,
                                                         max_tokens=6)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"next {i}"})
        return AgentResult(reward=0.5, answer=messages[-2]["content"],
                           info={"messages": messages[:-1]})


class Rewrites(AgentEnv):
    """Turn 2 drops the history (a summarising agent): a second segment."""

    def task(self, seed: int) -> Any:
        return "q"

    async def run(self, client: Any, task: Any) -> float:
        first = [{"role": "user", "content": "start"}]
        a = await client.chat.completions.create(model=self.model, messages=first, max_tokens=4)
        again = [{"role": "user", "content": "summary: " + (a.choices[0].message.content or "")}]
        await client.chat.completions.create(model=self.model, messages=again, max_tokens=4)
        return 1.0


def _descriptor(cls: type) -> Descriptor:
    return Descriptor(kind="env", name=cls.__name__, factory=cls, options=NoOptions,
                      summary="", plugin="test")


def _parts(model: ModelConfig, env_cls: type, gateway: Gateway, max_turns: int = 5,
           template: str | None = None) -> Any:
    tok = load_tokenizer(model.path, light=True)
    chat = ChatFormat(tok, template=template)
    engine = SpyEngine(model)
    proxy = LLMProxy([WorkerHandle("gen0", engine, is_ray=False)], {"default": ["gen0"]})
    cfg = TaskConfig(tag="agent", env={"name": env_cls.__name__}, max_turns=max_turns,
                     step_timeout_s=120, sampling={"max_new_tokens": 8})
    task = TaskRuntime(cfg, None, None, chat, gateway=gateway)
    host = inline_handle({"agent": (_descriptor(env_cls), NoOptions())}, on_loop=False)
    return tok, engine, proxy, task, host


def _manager(parts: Any, tid: str = "traj-0", sample_seed: int = 7) -> AgentManager:
    tok, engine, proxy, task, host = parts
    reward = WorkerHandle("reward", Rewards(), is_ray=False)
    return AgentManager(Trajectory(tid, "agent", "g0", 0), 3, sample_seed, task,
                        task.prompt_format,
                        proxy, host, reward, version=lambda: 0)


def _episode(model: ModelConfig, env_cls: type, template: str | None = None,
             sample_seed: int = 7) -> tuple[Any, Trajectory]:
    """One episode of ``env_cls`` behind a fresh gateway: ``(_parts(...), trajectory)``."""
    async def main() -> tuple[Any, Trajectory]:
        gw = Gateway()
        parts = _parts(model, env_cls, gw, template=template)
        traj = await _manager(parts, sample_seed=sample_seed).run()
        await gw.stop()
        return parts, traj

    return asyncio.run(main())


def test_three_turn_agent_is_one_trajectory_of_the_engines_tokens(model: ModelConfig) -> None:
    (tok, engine, _, _, _), traj = _episode(model, ThreeTurns)
    assert traj.dropped is None, traj.dropped
    assert traj.info["agent_segments"] == 1 and traj.info["agent_requests"] == 3
    assert len(traj.turns) == 3 and traj.reward == 0.5
    # Each turn's trained tokens are exactly what the engine generated, with its log-probs.
    for turn, result in zip(traj.turns, engine.results, strict=True):
        assert turn.action_ids == result.token_ids and turn.logprobs == result.logprobs
    sample = traj.to_sample()
    # The engine was prompted with the growing context itself: each prompt is the sample's
    # prefix (no re-tokenisation of earlier turns).
    for prompt in engine.prompts:
        assert sample.input_ids[:len(prompt)] == prompt
    # Loss mask: 1 exactly on the generated tokens.
    expect = []
    for turn in traj.turns:
        expect += [0] * len(turn.obs_ids) + [1] * len(turn.action_ids)
    assert sample.loss_mask == expect and sum(expect) == sum(len(r.token_ids)
                                                             for r in engine.results)
    # The context of the last turn is the template's render of the agent's messages.
    messages = traj.info["messages"]
    rendered = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    last_prompt = engine.prompts[-1]
    assert tok.decode(last_prompt, skip_special_tokens=False) == rendered


def test_rewritten_history_starts_a_new_segment(model: ModelConfig) -> None:
    (tok, engine, _, _, _), traj = _episode(model, Rewrites)
    assert traj.dropped is None and traj.info["agent_segments"] == 2
    # Both segments are trained, each its own sample: the last (segment 0) is the render of
    # the second request, then the first request's.
    assert len(traj.turns) == 1 and traj.turns[0].action_ids == engine.results[1].token_ids
    assert traj.turns[0].obs_ids == engine.prompts[1]
    last, first = traj.to_samples()
    assert last.input_ids == engine.prompts[1] + engine.results[1].token_ids
    assert first.input_ids == engine.prompts[0] + engine.results[0].token_ids
    assert (last.segment, first.segment) == (0, 1) and first.reward == last.reward == 1.0
    assert sum(first.loss_mask) == len(engine.results[0].token_ids)


class ThinksOnce(AgentEnv):
    """Qwen 3's switch per request (vLLM's and SGLang's ``chat_template_kwargs``): the
    first request without thinking, the second with the template's default."""

    def task(self, seed: int) -> Any:
        return "q"

    async def run(self, client: Any, task: Any) -> float:
        messages = [{"role": "user", "content": "hi"}]
        off = await client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=3,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        messages += [{"role": "assistant", "content": off.choices[0].message.content},
                     {"role": "user", "content": "more"}]
        await client.chat.completions.create(model=self.model, messages=messages,
                                             max_tokens=3)
        refused = 0
        for bad in ({"tools": []}, ["enable_thinking"]):
            try:
                await client.chat.completions.create(
                    model=self.model, messages=messages, max_tokens=3,
                    extra_body={"chat_template_kwargs": bad})
            except Exception as exc:  # noqa: BLE001 - the refusal is what is tested
                refused += "400" in str(exc) and "chat_template_kwargs" in str(exc)
        return float(refused)


def test_a_requests_chat_template_kwargs_reach_the_render(model: ModelConfig) -> None:
    """``extra_body={"chat_template_kwargs": {"enable_thinking": False}}`` renders that
    request with Qwen 3's empty think block (as vLLM does), the next request without it;
    variables the gateway sets itself, or a non-object, are a 400."""
    from pathlib import Path

    qwen3 = (Path(__file__).resolve().parents[1] / "data" / "chat_templates"
             / "qwen3.jinja").read_text()

    (tok, engine, _, _, _), traj = _episode(model, ThinksOnce, template=qwen3)
    assert traj.dropped is None, traj.dropped
    assert traj.reward == 2.0  # both bad kwargs refused
    first, second = (tok.decode(p, skip_special_tokens=False) for p in engine.prompts)
    assert first.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert second.endswith("<|im_start|>assistant\n") and "more" in second


async def _post(url: str, token: str | None, body: bytes) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
        return r.status, await r.json()


class FollowsSecondChoice(AgentEnv):
    """One turn, then two choices; goes on from the second, then starts over once
    (``/v1/completions``: a prompt that extends a turn's text continues its segment)."""

    def task(self, seed: int) -> Any:
        return "q"

    async def run(self, client: Any, task: Any) -> AgentResult:
        async def complete(prompt: str, **kw: Any) -> Any:
            return await client.completions.create(model=self.model, prompt=prompt,
                                                   max_tokens=4, **kw)

        text = "start:"
        text += (await complete(text)).choices[0].text + " pick:"
        both = await complete(text, n=2, temperature=1.0)
        text += both.choices[1].text + " go:"
        second = await complete(text)
        last = await complete("so:" + second.choices[0].text)
        return AgentResult(reward=1.0, answer=last.choices[0].text)


def test_a_followed_branch_is_trained_as_sampled_and_the_other_counted(
        model: ModelConfig) -> None:
    """n = 2 on a running episode, through the real client: the trained samples are
    the contexts the engine sampled in (the followed choice right after the turn before
    it; before the fix the first choice's turn sat between them, trained), the segment
    before the rewrite is trained too, the other choice is counted as untrained."""
    (tok, engine, _, _, _), traj = _episode(model, FollowsSecondChoice, sample_seed=1)
    # Sampling seed 1: no choice holds a special token (the tiny model's <unk> is dropped
    # from the returned text, so the agent's next prompt would not extend the branch).
    assert all(i > 5 for r in engine.results for i in r.token_ids)
    assert traj.dropped is None, traj.dropped
    assert traj.info["agent_branches_untrained"] == 1 and traj.info["agent_segments"] == 3
    last, followed = traj.to_samples()
    assert last.input_ids == engine.prompts[-1] + engine.results[-1].token_ids
    # The followed branch's sample: the second request's prompt (which holds the second
    # choice as the agent sent it back) plus its answer; the second choice's own tokens
    # are trained and the first choice's appear nowhere.
    second_prompt, second = engine.prompts[-2], engine.results[-2]
    assert followed.input_ids == second_prompt + second.token_ids
    opening, choices = engine.results[0], engine.results[1:-2]
    assert len(choices) == 2
    picked = next(r for r in choices
                  if followed.input_ids[len(engine.prompts[1]):][:len(r.token_ids)]
                  == r.token_ids)
    trained = [i for i, k in zip(followed.input_ids, followed.loss_mask, strict=True) if k]
    assert trained == opening.token_ids + picked.token_ids + second.token_ids
    assert sum(last.loss_mask) + sum(followed.loss_mask) == (
        len(engine.results[-1].token_ids) + len(trained))


def test_refusals_are_clear_4xx_and_record_nothing(model: ModelConfig) -> None:
    async def never(ids: list[int], sampling: Any) -> Any:
        raise AssertionError("a refused request reached the engine")

    async def main() -> list[tuple[int, str]]:
        gw = Gateway(max_body_bytes=1 << 20)
        await gw.start()
        tok = load_tokenizer(model.path, light=True)
        parts = _parts(model, ThreeTurns, gw)
        mgr = _manager(parts)
        eps = [gw.open(f"e{i}", record=mgr._record(), generate=never,
                       sampling=parts[3].sampling(0), max_turns=4, max_context_tokens=512,
                       stop_ids={tok.eos_token_id}, decode_text=tok.decode) for i in range(2)]
        a, b = eps
        good = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
        cases = [
            (a.base_url, None, good.encode()),  # no token
            (a.base_url, b.token, good.encode()),  # another episode's token
            (a.base_url, a.token, b"{" + b" " * (10 * 2**20) + b"}"),  # a 10 MB body
            (a.base_url, a.token, b"{not json"),  # malformed JSON
            (a.base_url, a.token, good.replace("policy", "gpt-4o").encode()),  # unknown model
            (a.base_url, a.token, json.dumps({"model": "policy", "messages": []}).encode()),
        ]
        out = []
        for base, token, body in cases:
            status, payload = await _post(base + "/chat/completions", token, body)
            out.append((status, payload["error"]["message"]))
        # The openai client raises them clearly (here: the unknown model).
        client = openai.AsyncOpenAI(base_url=a.base_url, api_key=a.token, max_retries=0)
        with pytest.raises(openai.NotFoundError, match="gpt-4o"):
            await client.chat.completions.create(model="gpt-4o", messages=[
                {"role": "user", "content": "hi"}])
        models = await client.models.list()
        assert [m.id for m in models.data] == ["policy"]
        await client.close()
        assert all(not ep.record.segments and ep.requests == 0 for ep in eps)
        await gw.stop()
        return out

    out = asyncio.run(main())
    assert [s for s, _ in out] == [401, 403, 413, 400, 404, 400]
    assert "token" in out[0][1] and "does not belong" in out[1][1]
    assert "limit" in out[2][1] and "JSON" in out[3][1] and "gpt-4o" in out[4][1]
    assert "messages" in out[5][1]


def test_aborted_episode_answers_410_and_is_dropped(model: ModelConfig) -> None:
    """A trajectory aborted while its agent waits (here: the engines suspended, as at a
    weight update, then the trajectory aborted for staleness) ends with a 410 the agent's
    client raises, and the trajectory is dropped with the reason."""

    async def main() -> Any:
        gw = Gateway()
        parts = _parts(model, ThreeTurns, gw)
        proxy = parts[2]
        await proxy.suspend()
        mgr = _manager(parts)
        run = asyncio.ensure_future(mgr.run())
        for _ in range(600):  # until the agent's first request waits for admission
            if proxy._admitting:
                break
            await asyncio.sleep(0.05)
        assert proxy._admitting, "the agent's request never reached the proxy"
        assert await mgr.abort("stale")
        await proxy.resume()  # as the pipeline does after the update; the abort stands
        traj = await asyncio.wait_for(run, 120)
        await gw.stop()
        return traj

    traj = asyncio.run(main())
    assert traj.dropped == "aborted:stale"
    assert traj.reward is None and traj.info["agent_requests"] == 1
    assert traj.info["gateway_refused_410"] == 1, traj.info


class SdkAgent(AgentEnv):
    """The OpenAI Agents SDK itself (``pip install openai-agents``), unmodified: an Agent
    with a function tool on an ``OpenAIChatCompletionsModel`` over the episode's client."""

    def task(self, seed: int) -> Any:
        return {"question": "What is 2 + 3? Use the add tool.", "answer": "5"}

    async def run(self, client: Any, task: Any) -> AgentResult:
        from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool

        @function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        agent = Agent(name="calc", instructions="You add numbers with the add tool.",
                      tools=[add], model=OpenAIChatCompletionsModel(model=self.model,
                                                                   openai_client=client))
        result = await Runner.run(agent, task["question"], max_turns=3,
                                  run_config=RunConfig(tracing_disabled=True))
        answer = str(result.final_output)
        return AgentResult(reward=float(task["answer"] in answer), answer=answer)


def test_openai_agents_sdk_agent_is_trained_on_the_engines_tokens(model: ModelConfig) -> None:
    import importlib.util

    assert importlib.util.find_spec("agents") is not None, (
        "openai-agents is not installed; bash scripts/install.sh --dev installs it (or pip "
        "install -c constraints.txt 'openai-agents==0.24.0')")

    async def main() -> Any:
        gw = KeepingGateway()
        parts = _parts(model, SdkAgent, gw)
        traj = await _manager(parts).run()
        await gw.stop()
        return parts, traj, gw.kept[0]

    (tok, engine, _, _, _), traj, ep = asyncio.run(main())
    assert traj.dropped is None, traj.dropped
    assert not [k for k in traj.info if k.startswith("gateway_refused")], traj.info
    assert traj.info["agent_requests"] >= 1
    seg = ep.record.segments[-1]
    n = len(seg.turns)
    assert traj.turns == seg.turns and n >= 1
    # The trained sample is the engine's tokens on the engine's prompts.
    for turn, result in zip(traj.turns, engine.results[-n:], strict=True):
        assert turn.action_ids == result.token_ids and turn.logprobs == result.logprobs
    assert traj.to_sample().input_ids[:len(engine.prompts[-1])] == engine.prompts[-1]
    # The last prompt is the template's render of the messages (and tools) the SDK sent.
    assert any(m["role"] == "system" for m in seg.messages)
    rendered = tok.apply_chat_template(seg.messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(engine.prompts[-1], skip_special_tokens=False) == rendered


class SdkStructuredAgent(AgentEnv):
    """The Agents SDK with an ``output_type``: it asks for ``response_format``
    ``json_schema``, which the engines cannot enforce."""

    def task(self, seed: int) -> Any:
        return "What is 2 + 3?"

    async def run(self, client: Any, task: Any) -> AgentResult:
        from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner
        from pydantic import BaseModel

        class Answer(BaseModel):
            value: int

        agent = Agent(name="calc", instructions="Answer.", output_type=Answer,
                      model=OpenAIChatCompletionsModel(model=self.model, openai_client=client))
        result = await Runner.run(agent, task, max_turns=2,
                                  run_config=RunConfig(tracing_disabled=True))
        return AgentResult(reward=1.0, answer=str(result.final_output))


def test_an_agents_sdk_output_type_is_refused_and_the_episode_dropped_saying_why(
        model: ModelConfig) -> None:
    """Structured output would come back unconstrained (the engines sample without a
    grammar): the gateway refuses the request (400), nothing reaches the engine, and the
    episode is dropped with the gateway's reason, not trained on free text."""
    (_, engine, _, _, _), traj = _episode(model, SdkStructuredAgent)
    assert traj.dropped is not None and "response_format 'json_schema'" in traj.dropped, (
        traj.dropped)
    assert "ask for the format in the prompt" in traj.dropped
    assert not engine.prompts and traj.info.get("gateway_refused_400") == 1


def test_streaming_and_logprobs_carry_the_engines_answer(model: ModelConfig) -> None:
    async def main() -> Any:
        gw = Gateway()
        await gw.start()
        tok, engine, proxy, task, _ = _parts(model, ThreeTurns, gw)
        mgr = _manager(_parts(model, ThreeTurns, gw))

        async def generate(ids: list[int], sampling: Any) -> Any:
            from rollart_sdk.types import GenerationRequest

            return await engine.generate(GenerationRequest(f"r{len(engine.results)}", ids,
                                                           sampling))

        ep = gw.open("s", record=mgr._record(), generate=generate, sampling=task.sampling(1),
                     max_turns=4, max_context_tokens=512, stop_ids={tok.eos_token_id},
                     decode_text=task.prompt_format.decode)
        client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.token, max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        stream = await client.chat.completions.create(
            model="policy", messages=msgs, stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        full = await client.chat.completions.create(model="policy", messages=msgs,
                                                    logprobs=True)
        await client.close()
        await gw.stop()
        return tok, engine, chunks, full

    tok, engine, chunks, full = asyncio.run(main())
    first, second = engine.results
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = [i for i in first.token_ids if i != tok.eos_token_id]
    assert text == tok.decode(ids, skip_special_tokens=True)
    assert chunks[-1].usage.completion_tokens == len(first.token_ids)
    assert [x.logprob for x in full.choices[0].logprobs.content] == second.logprobs


_UPDATED = threading.Event()


class AcrossUpdate(AgentEnv):
    """Two turns with a weight update between them (the agent waits for it)."""

    def task(self, seed: int) -> Any:
        return "q"

    async def run(self, client: Any, task: Any) -> float:
        messages = [{"role": "user", "content": "one"}]
        a = await client.chat.completions.create(model=self.model, messages=messages,
                                                 max_tokens=4)
        await asyncio.to_thread(_UPDATED.wait, 120)
        messages += [{"role": "assistant", "content": a.choices[0].message.content},
                     {"role": "user", "content": "two"}]
        await client.chat.completions.create(model=self.model, messages=messages, max_tokens=4)
        return 1.0


def test_an_episode_within_the_bound_continues_across_a_weight_update(
        model: ModelConfig) -> None:
    from rollart_sdk.models import load_causal_lm
    from rollart_sdk.types import WeightBucket

    async def main() -> Any:
        gw = Gateway()
        parts = _parts(model, AcrossUpdate, gw)
        engine = parts[1]
        _UPDATED.clear()
        run = asyncio.ensure_future(_manager(parts).run())
        for _ in range(1200):
            if engine.results:
                break
            await asyncio.sleep(0.05)
        weights = load_causal_lm(model.path).state_dict()
        await engine.engine.load_weights([WeightBucket(1, 0, dict(weights))], version=1)
        _UPDATED.set()
        traj = await asyncio.wait_for(run, 120)
        await gw.stop()
        return traj

    traj = asyncio.run(main())
    assert traj.dropped is None and traj.info["agent_segments"] == 1
    assert set(traj.turns[0].versions) == {0} and set(traj.turns[1].versions) == {1}
    assert traj.versions == {0, 1} and traj.reward == 1.0
