"""``/v1/completions``, ``n > 1``, ``stop`` and the sampling fields, through the real
``openai`` client against the real gateway on 127.0.0.1, backed by the torch engine on the
tiny model (a spy keeps what the engine generated)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

openai = pytest.importorskip("openai")
rollart_engine_torch = pytest.importorskip("rollart_engine_torch.engine")

from rollart_sdk.config import ModelConfig  # noqa: E402
from rollart_sdk.control.chat import ChatFormat  # noqa: E402
from rollart_sdk.gateway import Gateway  # noqa: E402
from rollart_sdk.gateway.episode import EpisodeRecord  # noqa: E402
from rollart_sdk.models import load_tokenizer  # noqa: E402
from rollart_sdk.types import GenerationRequest, SamplingParams, Trajectory  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class Setup:
    """A gateway, one episode on it, the torch engine behind it, an ``openai`` client."""

    def __init__(self, model: ModelConfig, max_new_tokens: int = 12) -> None:
        self.tok = load_tokenizer(model.path, light=True)
        self.chat = ChatFormat(self.tok)
        self.engine = rollart_engine_torch.TorchEngine(model=model, max_running=8,
                                                      max_seq_len=1024)
        self.prompts: list[list[int]] = []
        self.results: list[Any] = []
        self.gw = Gateway()
        self.max_new_tokens = max_new_tokens
        self.client: Any = None

    def _open(self) -> Any:
        tok = self.tok
        record = EpisodeRecord(
            lambda messages, tools: str(tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True)),
            lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
            lambda ids: str(tok.decode(ids, skip_special_tokens=False)))
        return self.gw.open("e0", record=record, generate=self.generate,
                            sampling=SamplingParams(max_new_tokens=self.max_new_tokens, seed=3),
                            max_turns=10, max_context_tokens=900,
                            stop_ids={tok.eos_token_id}, decode_text=self.chat.decode)

    async def generate(self, ids: list[int], sampling: SamplingParams) -> Any:
        self.prompts.append(list(ids))
        result = await self.engine.generate(GenerationRequest(uuid.uuid4().hex, list(ids),
                                                              sampling))
        self.results.append(result)
        return result

    async def __aenter__(self) -> Setup:
        await self.gw.start()  # before open: the base URL names the port
        self.ep = self._open()
        self.client = openai.AsyncOpenAI(base_url=self.ep.base_url, api_key=self.ep.token,
                                         max_retries=0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.close()
        await self.gw.stop()

    def sample(self, segment: int) -> Any:
        traj = Trajectory("t", "agent", "g", 0)
        traj.turns = list(self.ep.record.segments[segment].turns)
        return traj.to_sample()


USER = [{"role": "user", "content": "Say something."}]


def test_completions_text_then_ids_continue_one_segment_of_the_engines_tokens(
        model: ModelConfig) -> None:
    async def main() -> Any:
        async with Setup(model) as s:
            first = await s.client.completions.create(model="policy", prompt="Once upon a",
                                                      max_tokens=6, logprobs=1)
            more = s.tok(" then", add_special_tokens=False)["input_ids"]
            ids = s.prompts[0] + s.results[0].token_ids + more
            second = await s.client.completions.create(model="policy", prompt=ids,
                                                       max_tokens=6)
            stream = await s.client.completions.create(model="policy", prompt="Once", n=2,
                                                       max_tokens=3, stream=True)
            chunks = [c async for c in stream]
            texts = {c.choices[0].index: c.choices[0].text for c in chunks}
            assert texts == {i: s.chat.decode(s.results[2 + i].token_ids) for i in (0, 1)}
            return s, first, second, more

    s, first, second, more = asyncio.run(main())
    r0, r1 = s.results[:2]
    assert s.prompts[0] == s.tok("Once upon a", add_special_tokens=False)["input_ids"]
    assert first.choices[0].text == s.chat.decode(r0.token_ids)
    assert first.choices[0].logprobs.token_logprobs == r0.logprobs
    assert second.usage.completion_tokens == len(r1.token_ids)
    # The ids prompt extended the first turn's tokens: one segment, nothing re-tokenised.
    seg = s.ep.record.segments[0]  # (then the streamed request's two branches)
    assert len(s.ep.record.segments) == 3
    assert [t.action_ids for t in seg.turns] == [r0.token_ids, r1.token_ids]
    assert seg.turns[1].obs_ids == more
    sample = s.sample(0)
    assert sample.input_ids == s.prompts[1] + r1.token_ids
    assert sum(sample.loss_mask) == len(r0.token_ids) + len(r1.token_ids)


def test_n_choices_are_branches_and_the_agent_continues_the_one_it_sends_back(
        model: ModelConfig) -> None:
    def clean(r: Any, s: Setup) -> bool:  # no special token mid-reply (<pad> is one here):
        ids = [i for i in r.token_ids if i != s.tok.eos_token_id]  # its render differs
        return s.chat.decode(ids) == s.tok.decode(ids, skip_special_tokens=False)

    async def main() -> Any:
        async with Setup(model) as s:
            three = await s.client.chat.completions.create(model="policy", messages=USER,
                                                           n=3, max_tokens=5)
            picks = [k for k in range(3) if clean(s.results[k], s)]
            assert picks, "no choice without a special token: change the episode's seed"
            k = picks[-1]
            after = [*USER, {"role": "assistant", "content": three.choices[k].message.content},
                     {"role": "user", "content": "And?"}]
            await s.client.chat.completions.create(model="policy", messages=after,
                                                   max_tokens=5)
            return s, three, k

    s, three, k = asyncio.run(main())
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert len(s.results) == 4 and three.usage.completion_tokens == sum(
        len(r.token_ids) for r in s.results[:3])
    assert len({tuple(r.token_ids) for r in s.results[:3]}) > 1  # each its own sample
    # Each choice recorded as its own branch; the next request extended choice k's.
    segs = s.ep.record.segments
    expect = [[s.results[i].token_ids] for i in range(3)]
    expect[k].append(s.results[3].token_ids)
    assert [[t.action_ids for t in seg.turns] for seg in segs] == expect
    trained, guessed = s.ep.record.trained()
    assert trained is segs[k] and not guessed
    assert s.prompts[3][:len(s.prompts[2])] == s.prompts[2]  # continued on its tokens
    assert s.sample(k).input_ids == s.prompts[3] + s.results[3].token_ids


def test_stop_cuts_the_reply_and_the_recorded_tokens_where_the_model_wrote_it(
        model: ModelConfig) -> None:
    async def main() -> Any:
        async with Setup(model, max_new_tokens=16) as s:
            full = await s.client.chat.completions.create(model="policy", messages=USER,
                                                          seed=11)
            text = full.choices[0].message.content
            stop = text[len(text) // 2:len(text) // 2 + 2]
            cut = await s.client.chat.completions.create(model="policy", messages=USER,
                                                         seed=11, stop=[stop, "\x07"])
            return s, text, stop, cut

    s, text, stop, cut = asyncio.run(main())
    whole, short = s.results  # the same seed: the engine sampled the same tokens
    assert whole.token_ids == short.token_ids
    assert len(text) >= 4, "the tiny model's reply is too short for this test"
    assert cut.choices[0].message.content == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    recorded = s.ep.record.segments[-1].turns[-1]
    k = len(recorded.action_ids)
    # The tokens through the one that completed the stop sequence, no further.
    assert recorded.action_ids == whole.token_ids[:k] and k < len(whole.token_ids)
    assert stop in s.chat.decode(whole.token_ids[:k])
    assert stop not in s.chat.decode(whole.token_ids[:k - 1])
    assert recorded.logprobs == whole.logprobs[:k]


def test_sampling_fields_are_mapped_or_refused_naming_the_field(model: ModelConfig) -> None:
    async def main() -> Any:
        async with Setup(model) as s:
            errors = {}
            bad: list[dict[str, Any]] = [
                {"temperature": 0.2}, {"top_p": 0.5}, {"presence_penalty": 1.0},
                {"logit_bias": {"5": 10}}, {"n": 9}, {"stop": ["a", "b", "c", "d", "e"]},
                {"max_tokens": 0}, {"max_completion_tokens": -3},
                {"response_format": {"type": "json_object"}},
                {"response_format": {"type": "json_schema", "json_schema": {
                    "name": "answer", "schema": {"type": "object"}}}}]
            # The engines' own fields, as a client sends them (extra_body).
            extra: list[dict[str, Any]] = [{"top_k": 5}, {"repetition_penalty": 1.2},
                                           {"min_p": 0.1}, {"guided_json": {"type": "object"}}]
            for fields in bad + [{"extra_body": e} for e in extra]:
                with pytest.raises(openai.BadRequestError) as info:
                    await s.client.chat.completions.create(model="policy", messages=USER,
                                                           **fields)
                named = fields.get("extra_body", fields)
                errors[next(iter(named))] = info.value
            with pytest.raises(openai.BadRequestError, match="prompt") as info:
                await s.client.completions.create(model="policy", prompt=["a", "b"])
            assert s.ep.requests == 0 and not s.ep.record.segments and not s.results
            # The task's own values, a seed, and a token limit are taken.
            ok = await s.client.chat.completions.create(
                model="policy", messages=USER, temperature=1.0, top_p=1, seed=4,
                max_completion_tokens=3, stop="zzz", response_format={"type": "text"},
                extra_body={"top_k": -1, "repetition_penalty": 1.0})
            return s, errors, ok

    s, errors, ok = asyncio.run(main())
    for field, exc in errors.items():
        assert exc.status_code == 400 and field in exc.message, (field, exc.message)
        assert exc.body["param"] == field
    assert "tasks[].sampling.temperature" in errors["temperature"].message
    assert "ask for the format in the prompt" in errors["response_format"].message
    assert "tasks[].sampling.top_k" in errors["top_k"].message
    assert len(s.results[0].token_ids) <= 3 and ok.usage.completion_tokens <= 3


CALC = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


def test_required_tool_choice_forces_prompt_tokens_and_a_failed_call_is_content(
        model: ModelConfig) -> None:
    """The random tiny model does not finish the forced call: the reply is plain content
    (the forced text, then what it wrote), 200 not 500, counted; the engine got the
    opening as the end of its prompt and the recorded turn trains only its own tokens.
    A named function not in tools is a 400 the client raises."""

    async def main() -> tuple[Setup, Any]:
        async with Setup(model) as s:
            reply = await s.client.chat.completions.create(
                model="policy", messages=USER, tools=CALC, tool_choice="required")
            with pytest.raises(openai.BadRequestError, match="not in tools"):
                await s.client.chat.completions.create(
                    model="policy", messages=USER, tools=CALC,
                    tool_choice={"type": "function", "function": {"name": "search"}})
            return s, reply

    s, reply = asyncio.run(main())
    forced = '<tool_call>\n{"name": "calculator", "arguments":'  # the parser's opener
    forced_ids = s.tok(forced, add_special_tokens=False)["input_ids"]
    assert s.prompts[0][-len(forced_ids):] == forced_ids
    counts = s.ep.counts
    assert counts["forced_tool_choice"] == 1 and counts["forced_prefix_tokens"] == len(forced_ids)
    assert counts["forced_opener_from_parser"] == 1  # this record has no render_turn
    message = reply.choices[0].message
    if message.tool_calls is None:  # what the random model does
        assert counts["forced_tool_call_failed"] == 1
        assert (message.content or "").startswith(forced)
        assert reply.choices[0].finish_reason in ("stop", "length")
    turn = s.ep.record.segments[0].turns[0]
    assert turn.action_ids == s.results[0].token_ids
    assert turn.obs_ids[-len(forced_ids):] == forced_ids
    assert reply.usage.prompt_tokens == len(s.prompts[0])
    assert len(s.prompts) == 1  # the refused request reached no engine
