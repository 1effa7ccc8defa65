"""The turns that reach one engine worker together go in one ``generate_many`` call
(control/batching.py): one call per wave, each caller still gets its own result when its
request finishes, and a failed call is handled per request as a lone ``generate`` is. A
turn that goes alone is a plain ``generate`` call (on Ray a stream costs about 0.9 ms more
per round trip)."""

from __future__ import annotations

import asyncio

import pytest

from rollart_sdk.cluster.roles import EngineWorker
from rollart_sdk.control.handles import WorkerHandle
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.types import GenerationRequest, GenerationResult

pytestmark = pytest.mark.timeout(120)


class Engine:
    """An engine worker whose ``generate_many`` is the real one (EngineWorker's); each
    request answers after ``delay[request_id]`` seconds (default 0.01)."""

    generate_many = EngineWorker.generate_many

    def __init__(self, name: str, delay: dict[str, float] | None = None,
                 fail: set[str] | None = None) -> None:
        self.name = name
        self.delay = delay or {}
        self.fail = fail or set()
        self.batches: list[list[str]] = []  # request ids of each generate_many call
        self.seen: list[str] = []  # every request that reached generate
        self.aborted: list[str] = []

    @property
    def singles(self) -> list[str]:
        """The requests sent as a plain generate call (not in a generate_many)."""
        batched = {rid for b in self.batches for rid in b}
        return [rid for rid in self.seen if rid not in batched]

    async def generate(self, request: GenerationRequest, kv=None) -> GenerationResult:
        self.seen.append(request.request_id)
        await asyncio.sleep(self.delay.get(request.request_id, 0.01))
        if request.request_id in self.fail:
            raise ValueError(f"bad request {request.request_id}")
        return GenerationResult(request.request_id, [len(request.prompt_ids)], [-0.5], [0],
                                "stop", worker=self.name)

    async def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return True


class Counting(Engine):
    def generate_many(self, requests):  # type: ignore[override]
        self.batches.append([r.request_id for r in requests])
        return Engine.generate_many(self, requests)


def req(i: int, n: int = 3) -> GenerationRequest:
    return GenerationRequest(f"t{i}/0", list(range(n + i)), trajectory_id=f"t{i}")


def proxy_over(*engines: Engine) -> LLMProxy:
    handles = [WorkerHandle(e.name, e, is_ray=False) for e in engines]
    return LLMProxy(handles, {"default": [e.name for e in engines]}, batch_calls=True)


def test_a_wave_of_turns_is_one_call_and_each_caller_gets_its_own_result() -> None:
    async def main() -> None:
        engine = Counting("e0", delay={"t0/0": 0.3})
        proxy = proxy_over(engine)
        tasks = [asyncio.create_task(proxy.generate(req(i))) for i in range(64)]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        # The short ones come back without waiting for the slow one.
        assert tasks[0] not in done and not tasks[0].done()
        results = await asyncio.gather(*tasks)
        assert engine.batches == [[f"t{i}/0" for i in range(64)]]  # one call
        assert [r.request_id for r in results] == [f"t{i}/0" for i in range(64)]
        assert [r.token_ids for r in results] == [[3 + i] for i in range(64)]
        assert proxy.batched_calls == (1, 64)
        # The next wave is the next call; a lone turn is a plain generate call.
        await asyncio.gather(*(proxy.generate(req(i)) for i in range(64, 70)))
        result = await proxy.generate(req(99))
        assert [len(b) for b in engine.batches] == [64, 6] and engine.singles == ["t99/0"]
        assert result.request_id == "t99/0" and proxy.batched_calls == (3, 71)

    asyncio.run(main())


def test_a_requests_error_reaches_its_caller_only() -> None:
    async def main() -> None:
        proxy = proxy_over(Engine("e0", fail={"t1/0"}))
        results = await asyncio.gather(*(proxy.generate(req(i)) for i in range(3)),
                                       return_exceptions=True)
        assert isinstance(results[1], ValueError) and "bad request t1/0" in str(results[1])
        assert [r.finish_reason for r in (results[0], results[2])] == ["stop", "stop"]
        assert not proxy.down

    asyncio.run(main())


class DiesOnBatch(Counting):
    """Its process dies during its first generate_many call."""

    def generate_many(self, requests):  # type: ignore[override]
        self.batches.append([r.request_id for r in requests])

        async def dead():
            from ray.exceptions import ActorDiedError

            await asyncio.sleep(0.01)
            raise ActorDiedError()
            yield  # an async generator, as the real one

        return dead()


def test_a_worker_that_dies_during_a_call_has_each_of_its_requests_resent() -> None:
    async def main() -> None:
        dying, other = DiesOnBatch("e0"), Counting("e1")
        proxy = proxy_over(dying, other)
        # Sticky to e0 (least loaded first, by name): all 8 go there in one call.
        proxy._sticky.update({f"t{i}": "e0" for i in range(8)})
        results = await asyncio.wait_for(
            asyncio.gather(*(proxy.generate(req(i)) for i in range(8))), 10)
        assert "e0" in proxy.down and "ActorDiedError" in proxy.down["e0"]
        assert all(r.worker == "e1" and r.finish_reason == "stop" for r in results)
        assert proxy.rerouted == 8 and dying.batches == [[f"t{i}/0" for i in range(8)]]
        assert other.batches == [[f"t{i}/0" for i in range(8)]]  # re-sent together
        assert not proxy._inflight and not proxy._admitting

    asyncio.run(main())


class DiesOnGenerate(Counting):
    """Its process dies during a plain generate call."""

    async def generate(self, request: GenerationRequest, kv=None) -> GenerationResult:
        from ray.exceptions import ActorDiedError

        self.seen.append(request.request_id)
        await asyncio.sleep(0.01)
        raise ActorDiedError()


def test_a_lone_turn_on_a_worker_that_dies_is_resent_elsewhere() -> None:
    async def main() -> None:
        dying, other = DiesOnGenerate("e0"), Counting("e1")
        proxy = proxy_over(dying, other)
        proxy._sticky["t5"] = "e0"
        result = await asyncio.wait_for(proxy.generate(req(5)), 10)
        assert "e0" in proxy.down and "ActorDiedError" in proxy.down["e0"]
        assert result.worker == "e1" and result.finish_reason == "stop"
        assert dying.singles == ["t5/0"] and other.singles == ["t5/0"]
        assert proxy.rerouted == 1 and not proxy._inflight

    asyncio.run(main())


def test_a_caller_that_gives_up_gets_its_request_aborted() -> None:
    async def main() -> None:
        engine = Counting("e0", delay={"t0/0": 5.0})
        proxy = proxy_over(engine)
        slow = asyncio.create_task(proxy.generate(req(0)))
        fast = asyncio.create_task(proxy.generate(req(1)))
        await asyncio.sleep(0.1)
        slow.cancel()  # e.g. the generate timeout
        assert (await fast).finish_reason == "stop"
        with pytest.raises(asyncio.CancelledError):
            await slow
        for _ in range(100):
            if engine.aborted:
                break
            await asyncio.sleep(0.01)
        assert engine.aborted == ["t0/0"]  # the engine frees the slot
        # Cancelled before the call went out: the request is not sent at all.
        gone = asyncio.create_task(proxy.generate(req(2)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        await proxy.generate(req(3))
        assert engine.singles == ["t3/0"] and "t2/0" not in engine.seen

    asyncio.run(main())


def test_in_process_workers_are_not_batched_by_default() -> None:
    async def main() -> None:
        engine = Counting("e0")
        proxy = LLMProxy([WorkerHandle("e0", engine, is_ray=False)], {"default": ["e0"]})
        await asyncio.gather(*(proxy.generate(req(i)) for i in range(4)))
        assert engine.batches == [] and proxy.batched_calls == (0, 0)

    asyncio.run(main())


class Releasing(Counting):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.released: list[list[str]] = []

    async def release_many(self, trajectory_ids: list[str]) -> int:
        self.released.append(list(trajectory_ids))
        if "bad" in trajectory_ids:
            raise ValueError("release failed")
        return len(trajectory_ids)


def test_trajectories_that_end_together_are_released_in_one_call() -> None:
    async def main() -> None:
        engine = Releasing("e0")
        proxy = proxy_over(engine)
        await asyncio.gather(*(proxy.generate(req(i)) for i in range(5)))
        for i in range(5):
            proxy.release(f"t{i}")
        proxy._sticky["bad"] = "e0"
        for _ in range(10):
            await asyncio.sleep(0)
        assert engine.released == [[f"t{i}" for i in range(5)]]
        assert not proxy._sticky.keys() - {"bad"}  # the bindings are gone at once
        proxy.release("bad")  # a failed release is counted, not raised
        for _ in range(100):
            if proxy.release_errors:
                break
            await asyncio.sleep(0.01)
        assert proxy.release_errors == {"ValueError": 1} and not proxy._bg

    asyncio.run(main())
