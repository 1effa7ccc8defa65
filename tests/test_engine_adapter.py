"""rollart_sdk.engine_adapter (the half the vLLM and SGLang adapters share) on a scripted
engine: the real request / result / bucket types, the real asyncio coordination; only the
engine's token stream is a small stand-in (one token per loop tick, its id = position)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterable
from typing import Any

import pytest
import torch

from rollart_sdk.engine_adapter import (
    SEED_STRIDE,
    AdapterRequest,
    EngineAdapter,
    checkpoint_shapes,
    convert_buckets,
    eos_ids,
    submission_seed,
)
from rollart_sdk.errors import RollartError
from rollart_sdk.types import FinishReason, GenerationRequest, SamplingParams, WeightBucket


class ScriptedEngine(EngineAdapter[AdapterRequest]):
    """Emits token ``100 + position`` each tick while not paused; a submission ends at its
    max tokens, at a stop id, or when aborted. ``_swap`` moves in-flight requests the way
    the vLLM adapter does (abort + resubmit)."""

    ENGINE = "scripted"
    LIMIT_OPTION = "ctx"
    LIMIT_HINT = " (scripted hint)"

    def __init__(self, max_model_len: int = 64, eos: list[int] | None = None) -> None:
        self.max_model_len = max_model_len
        self.vocab_size = 1000
        self._eos = list(eos or [])
        self._init_adapter("scripted-engine")
        self.running = asyncio.Event()
        self.running.set()
        self.killed: set[str] = set()
        self.submissions: list[tuple[str, list[int], int]] = []  # sub_id, context, max tokens
        self.loaded: list[Any] = []
        self.closed = False

    def _new_request(self, request: GenerationRequest) -> AdapterRequest:
        return AdapterRequest(request)

    async def _drive(self, st: AdapterRequest) -> FinishReason:
        while True:
            context = await self._next_submission(st)
            if not isinstance(context, list):
                return context
            assert st.sub_id is not None
            sub, budget, version = st.sub_id, self._max_tokens(st), self._version
            self.submissions.append((sub, context, budget))
            reason = "abort"
            try:
                for _ in range(budget):
                    await self.running.wait()
                    await asyncio.sleep(0.001)
                    if sub in self.killed:
                        break
                    tok = 100 + len(st.out_ids)
                    st.out_ids.append(tok)
                    st.logprobs.append(-0.5)
                    st.versions.append(version)
                    self._outputs += 1
                    if tok in self._stop_ids(st):
                        reason = "stop"
                        break
                else:
                    reason = "length"
            except asyncio.CancelledError:
                st.aborted = True
                await self._abort_submission(sub)  # the caller gave up (as the SGLang adapter)
                raise
            finally:
                st.sub_id = None
                st.finished.set()
            if reason != "abort":
                return reason  # type: ignore[return-value]
            if st.resubmit and not st.aborted:
                st.resubmit = False
                continue
            return "abort"

    async def _abort_submission(self, sub_id: str) -> None:
        self.killed.add(sub_id)

    async def _pause(self) -> None:
        self.running.clear()

    async def _continue(self) -> None:
        self.running.set()

    async def _settle(self) -> None:
        await asyncio.sleep(0)

    def _prepare(self, buckets: Iterable[WeightBucket]) -> list[list[str]]:
        return convert_buckets(buckets, {"w": ([2, 2], "F32")}, lambda b: sorted(b.tensors))

    async def _swap(self, prepared: list[list[str]], version: int) -> int:
        await self.suspend()
        moved = [st for st in self._reqs.values() if st.sub_id is not None and not st.aborted]
        for st in moved:
            st.resubmit = True
            assert st.sub_id is not None
            self.killed.add(st.sub_id)
        self.running.set()  # let the killed submissions see it and end
        await self._wait_finished(moved)
        self.running.clear()
        self.loaded.append(prepared)
        self._version = version
        for st in moved:
            st.recomputed += 1
        self._recomputed_total += len(moved)
        await self.resume()
        return len(moved)

    def _capacity_stats(self) -> dict[str, Any]:
        return {"max_running": 4, **super()._capacity_stats()}

    async def _close(self) -> None:
        self.closed = True


def req(rid: str, n: int = 5, prompt: list[int] | None = None, **kw: Any) -> GenerationRequest:
    return GenerationRequest(rid, prompt or [1, 2, 3], SamplingParams(max_new_tokens=n, **kw))


async def until(cond: Any, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout)


def test_generate_to_length_and_stop_with_stats_keys() -> None:
    async def main() -> None:
        eng = ScriptedEngine(eos=[102])
        a = await eng.generate(req("a", n=4, stop_token_ids=[]))
        assert (a.token_ids, a.finish_reason, a.worker) == ([100, 101, 102], "stop", "scripted-engine")
        b = await eng.generate(req("b", n=2))
        assert (b.token_ids, b.finish_reason, b.versions, b.recomputed) == ([100, 101], "length", [0, 0], 0)
        # max tokens asked of a submission: the rest of max_new_tokens within the context
        c = await eng.generate(req("c", n=50, prompt=list(range(1, 63))))
        assert (c.token_ids, c.finish_reason) == ([100, 101], "length")
        assert eng.submissions[-1][2] == 2
        assert list(eng.stats()) == [
            "running", "waiting", "version", "tokens_generated", "steps", "suspended",
            "recomputed", "aborted", "max_running", "max_seq_len", "prompt_tokens",
            "prefix_cached_tokens",
        ]
        assert eng.stats()["steps"] == 7 and eng.stats()["max_seq_len"] == 64

    asyncio.run(main())


def test_bad_requests_name_the_option_and_duplicates_and_shutdown() -> None:
    async def main() -> None:
        eng = ScriptedEngine(max_model_len=8)
        with pytest.raises(ValueError, match=r"ctx.*\(scripted hint\)"):
            await eng.generate(req("long", prompt=list(range(1, 10))))
        task = asyncio.create_task(eng.generate(req("x", n=5)))
        await until(lambda: eng.submissions)
        await eng.suspend()  # x paused inside the engine: shutdown aborts and resumes it
        with pytest.raises(ValueError, match="request_id 'x' is already being generated"):
            await eng.generate(req("x"))
        await eng.shutdown()
        x = await task
        assert x.finish_reason == "abort" and len(x.token_ids) < 5 and eng.closed
        assert eng.stats()["aborted"] == 1 and eng.stats()["suspended"] is False
        with pytest.raises(RollartError, match="engine 'scripted' is shut down"):
            await eng.generate(req("y"))

    asyncio.run(main())


def test_shutdown_stops_the_engine_even_when_a_submission_never_ends(caplog) -> None:
    """An engine whose submission ignores its abort: shutdown waits SHUTDOWN_WAIT_S, says
    so, and still stops the engine (it used to raise TimeoutError and leave it running)."""

    class Deaf(ScriptedEngine):
        SHUTDOWN_WAIT_S = 0.2

        async def _abort_submission(self, sub_id: str) -> None:
            pass  # the engine never hears the abort

    async def main() -> None:
        eng = Deaf(max_model_len=1_000_000)  # ~1 ms a token: far from done at 0.2 s
        task = asyncio.create_task(eng.generate(req("stuck", n=100_000)))
        await until(lambda: eng.submissions)
        with caplog.at_level("WARNING", logger="rollart_sdk.engine_adapter"):
            await asyncio.wait_for(eng.shutdown(), 10)
        assert eng.closed
        assert "1 request(s) still running 0.2 s after their abort" in caplog.text
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_shutdown_stops_the_engine_when_its_core_is_dead() -> None:
    """An engine whose core died (vLLM's ``EngineDeadError`` on every call): the abort at
    shutdown raises, and the engine is still stopped (``_close``: vLLM's processes and
    the LoRA folders), the error reported."""

    class EngineDeadError(RuntimeError):
        pass

    class Dead(ScriptedEngine):
        async def _abort_submission(self, sub_id: str) -> None:
            raise EngineDeadError("EngineCore encountered an issue")

    async def main() -> None:
        eng = Dead(max_model_len=1_000_000)
        task = asyncio.create_task(eng.generate(req("running", n=100_000)))
        await until(lambda: eng.submissions)
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(eng.shutdown(), 10)
        assert eng.closed
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_abort_running_and_held_requests() -> None:
    async def main() -> None:
        eng = ScriptedEngine()
        run = asyncio.create_task(eng.generate(req("run", n=40)))
        await until(lambda: len(eng._reqs.get("run", AdapterRequest(req("-"))).out_ids) >= 2)
        await eng.suspend()
        held = asyncio.create_task(eng.generate(req("held", n=3)))
        await until(lambda: "held" in eng._reqs)
        assert eng.stats()["running"] == 1 and eng.stats()["waiting"] == 1
        assert await eng.abort("held") and not await eng.abort("held")
        assert not await eng.abort("nobody")
        h = await held
        assert (h.finish_reason, h.token_ids) == ("abort", [])
        assert [s for s, _, _ in eng.submissions] == ["run#1"]  # held: never submitted
        assert await eng.abort("run")
        await eng.resume()
        r = await run
        assert r.finish_reason == "abort" and 2 <= len(r.token_ids) < 40
        assert eng.stats()["aborted"] == 2 and eng.stats()["running"] == 0

    asyncio.run(main())


class SlowPauseEngine(ScriptedEngine):
    """A pause that takes effect only when ``pause_lands`` is set (vLLM's
    ``pause_generation`` waits for the engine's step to end)."""

    def __init__(self) -> None:
        super().__init__()
        self.pause_lands = asyncio.Event()

    async def _pause(self) -> None:
        await self.pause_lands.wait()
        self.running.clear()


def test_a_resume_that_arrives_while_the_engine_pauses_leaves_it_running() -> None:
    """On Ray a stop cancels the driver's suspend but not the actor's; the driver's resume
    then runs on the actor while that suspend still waits for its pause. The engine must
    end up running, and a request must still be served."""

    async def main() -> None:
        eng = SlowPauseEngine()
        suspend = asyncio.create_task(eng.suspend())
        await until(lambda: eng.stats()["suspended"])
        await eng.resume()  # the pause has not landed yet
        eng.pause_lands.set()
        await asyncio.wait_for(suspend, 5)
        assert eng.running.is_set() and not eng.stats()["suspended"]
        r = await asyncio.wait_for(eng.generate(req("after", n=3)), 5)
        assert r.finish_reason == "length" and len(r.token_ids) == 3
        # The usual order still pauses: suspend, then resume.
        eng.pause_lands.set()
        await eng.suspend()
        assert not eng.running.is_set() and eng.stats()["suspended"]
        await eng.resume()
        assert eng.running.is_set()

    asyncio.run(main())


def test_cancelled_caller_aborts_its_submission() -> None:
    async def main() -> None:
        eng = ScriptedEngine()
        task = asyncio.create_task(eng.generate(req("c", n=40)))
        await until(lambda: eng.submissions)
        eng.running.clear()
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert "c#1" in eng.killed and "c" not in eng._reqs

    asyncio.run(main())


def test_weight_update_resubmits_in_flight_requests_with_their_prefix() -> None:
    async def main() -> None:
        eng = ScriptedEngine()
        task = asyncio.create_task(eng.generate(req("r", n=10, seed=7)))
        await until(lambda: len(eng._reqs.get("r", AdapterRequest(req("-"))).out_ids) >= 3)
        bucket = WeightBucket(version=1, index=0, tensors={"w": torch.zeros(2, 2)})
        assert await eng.load_weights([bucket], 1) == 1
        res = await task
        assert res.finish_reason == "length" and res.token_ids == list(range(100, 110))
        k = res.versions.index(1)
        assert k >= 3 and res.versions == [0] * k + [1] * (10 - k) and res.recomputed == 1
        (s1, ctx1, n1), (s2, ctx2, n2) = eng.submissions
        assert (s1, s2) == ("r#1", "r#2") and ctx1 == [1, 2, 3] and n1 == 10
        assert ctx2 == [1, 2, 3, *res.token_ids[:k]] and n2 == 10 - k  # continues, not restarts
        assert eng.loaded == [[["w"]]] and eng.version == 1
        st = eng.stats()
        assert (st["recomputed"], st["version"], st["suspended"]) == (1, 1, False)

    asyncio.run(main())


def test_convert_buckets_checks_names_and_shapes_before_converting() -> None:
    shapes = {"a": ([2, 3], "F32"), "b": ([4], "BF16")}
    ok = WeightBucket(1, 0, {"a": torch.zeros(2, 3)})
    seen: list[int] = []
    out = convert_buckets([ok, WeightBucket(1, 1, {"b": torch.zeros(4)})], shapes,
                          lambda b: seen.append(b.index) or b.index)
    assert out == [0, 1] and seen == [0, 1]
    bad = WeightBucket(2, 3, {"a": torch.zeros(3, 2), "zz": torch.zeros(1)})
    with pytest.raises(ValueError) as e:
        convert_buckets([ok, bad], shapes, lambda b: b)
    assert str(e.value) == (
        "weight bucket 3 of version 2: 'a' has shape [3, 2], the model [2, 3]; "
        "'zz' is not a tensor of the served checkpoint"
    )
    with pytest.raises(ValueError, match="load_weights got no buckets"):
        convert_buckets([], shapes, lambda b: b)


def test_checkpoint_shapes_reads_safetensors_headers(tmp_path: Any) -> None:
    for fname, header in (("b.safetensors", {"y": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}),
                          ("a.safetensors", {"__metadata__": {"format": "pt"},
                                             "x": {"dtype": "F32", "shape": [2, 3],
                                                   "data_offsets": [0, 24]}})):
        raw = json.dumps(header).encode()
        (tmp_path / fname).write_bytes(struct.pack("<Q", len(raw)) + raw)
    (tmp_path / "notes.txt").write_text("ignored")
    assert checkpoint_shapes(str(tmp_path)) == {"x": ([2, 3], "F32"), "y": ([4], "BF16")}


def test_seeds_and_eos() -> None:
    assert submission_seed(5, 1, 9) == 5
    assert submission_seed(5, 2, 3) == 5 + 3 * SEED_STRIDE
    assert submission_seed((1 << 63) - 1, 3, 1) == SEED_STRIDE - 1

    class Hf:
        eos_token_id: Any = None

    assert eos_ids(Hf(), None) == []
    Hf.eos_token_id = 2
    assert eos_ids(Hf(), None) == [2] and eos_ids(Hf(), [7, 8]) == [7, 8]
    Hf.eos_token_id = [3, 4]
    assert eos_ids(Hf(), None) == [3, 4]


def test_checkpoint_shapes_lists_the_tied_lm_head(tmp_path: Any) -> None:
    """A tied model (SmolLM2) stores no lm_head.weight; a trainer's state_dict sends it."""
    header = {"model.embed_tokens.weight": {"dtype": "F32", "shape": [10, 4], "data_offsets": [0, 160]}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert "lm_head.weight" not in checkpoint_shapes(str(tmp_path))  # no config: not tied
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    assert "lm_head.weight" not in checkpoint_shapes(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    shapes = checkpoint_shapes(str(tmp_path))
    assert shapes["lm_head.weight"] == ([10, 4], "F32")
    bucket = WeightBucket(index=0, version=1, tensors={"lm_head.weight": torch.zeros(10, 4)})
    assert convert_buckets([bucket], shapes, lambda b: b.index) == [0]
