"""SampleBuffer and LLMProxy on their own: grouping, staleness eviction, quotas, routing."""

from __future__ import annotations

import asyncio

import pytest

from rollart_sdk.control.buffer import SampleBuffer
from rollart_sdk.control.handles import WorkerHandle
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.types import GenerationRequest, GenerationResult, Trajectory, Turn


def traj(tid, group, tag="A", version=0, dropped=None):
    t = Trajectory(tid, tag, group, version, reward=1.0, dropped=dropped)
    t.turns.append(Turn([1], [5, 6, 7], [0.0] * 3, [version] * 3))  # 3 generated tokens
    return t


def test_a_group_cut_only_by_the_run_end_counts_its_survivors_as_the_stops():
    async def main():
        buf = SampleBuffer(group_size=3)
        for i, why in enumerate([None, "aborted:run_end", None]):
            await buf.put(traj(f"a{i}", "g1", dropped=why))
        for i, why in enumerate([None, "aborted:run_end", "env_step_failed: boom"]):
            await buf.put(traj(f"b{i}", "g2", dropped=why))
        assert buf.dropped == {"aborted:run_end": 2, "group_incomplete:run_end": 2,
                               "env_step_failed": 1, "group_incomplete": 1}
        # Tokens: 3 a trajectory; those the stop cut (g1 whole, b1) are not waste.
        assert buf.tokens_dropped == 18 and buf.tokens_run_end == 12
        buf.drop_untrained([traj("c0", "g3"), traj("c1", "g3")], "run_end: stopped")
        assert buf.tokens_run_end == 18
        buf.redeem_untrained([traj("c0", "g3"), traj("c1", "g3")], "run_end")
        assert buf.tokens_run_end == 12 and buf.tokens_dropped == 18

    asyncio.run(main())


def test_groups_whole_stale_eviction_and_accounting():
    async def main():
        buf = SampleBuffer(group_size=2)
        await buf.put(traj("a1", "g1", version=0))
        assert buf.ready_groups == 0  # half a group is not ready
        await buf.put(traj("a2", "g1", version=0))
        await buf.put(traj("b1", "g2", version=1))
        await buf.put(traj("b2", "g2", version=1, dropped="env_step_failed: boom"))
        await buf.put(traj("c1", "g3", version=2))
        await buf.put(traj("c2", "g3", version=2))
        # g1 (version 0) is too old for min_version 1; g2 has one usable member only.
        batch = await asyncio.wait_for(buf.get_batch(2, min_version=1), 5)
        assert [t.trajectory_id for t in batch] == ["c1", "c2"]
        assert buf.dropped == {"stale": 2, "env_step_failed": 1, "group_incomplete": 1}
        # Trained once its train step returned; a batch never trained is counted dropped.
        assert buf.trained == 0
        buf.mark_trained(batch)
        assert buf.trained == 2
        buf.drop_untrained([traj("d1", "g4"), traj("d2", "g4")], "run_end: stopped")
        assert buf.trained == 2 and buf.dropped["run_end"] == 2
        late = [traj("e1", "g5"), traj("e2", "g5")]
        buf.drop_untrained(late, "run_end: stopped")
        buf.redeem_untrained(late, "run_end")  # the trainer did train it after all
        assert buf.trained == 4 and buf.dropped["run_end"] == 2
        assert all(t.dropped is None for t in late)

    asyncio.run(main())


def test_quota_waits_for_each_tasks_share():
    async def main():
        buf = SampleBuffer(group_size=2)
        for i in range(4):
            await buf.put(traj(f"a{i}", f"ga{i // 2}", tag="A"))
        waiter = asyncio.create_task(buf.get_batch(4, 0, quota={"A": 2, "B": 2}))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # plenty of A, no B yet
        await buf.put(traj("b0", "gb", tag="B"))
        await buf.put(traj("b1", "gb", tag="B"))
        batch = await asyncio.wait_for(waiter, 5)
        assert sorted(t.tag for t in batch) == ["A", "A", "B", "B"]
        assert buf.ready_by_tag() == {"A": 2}

    asyncio.run(main())


def test_take_groups_takes_what_get_batch_takes_as_the_groups_come():
    """A batch taken group by group (train.stream_groups) is the batch get_batch takes
    once every share is ready: each task's first ready groups, in that order; a group
    no task needs any more stays; stale groups are evicted first; the batch's
    dynamic-sampling figures are set when it is whole."""
    order = [("A", "ga0"), ("B", "gb0"), ("A", "ga1"), ("A", "ga2"), ("B", "gb1"),
             ("B", "gb2")]

    async def fill(buf, start, end):
        for tag, g in order[start:end]:
            for k in range(2):
                await buf.put(traj(f"{g}-{k}", g, tag=tag, version=1))

    async def main():
        whole = SampleBuffer(group_size=2)
        await whole.put(traj("old-0", "gold", tag="A", version=0))
        await whole.put(traj("old-1", "gold", tag="A", version=0))
        await fill(whole, 0, len(order))
        want = [t.trajectory_id for t in await whole.get_batch(8, 1, quota={"A": 4, "B": 4})]

        buf = SampleBuffer(group_size=2)
        await buf.put(traj("old-0", "gold", tag="A", version=0))
        await buf.put(traj("old-1", "gold", tag="A", version=0))
        need = {"A": 4, "B": 4}
        takes = []
        await fill(buf, 0, 1)
        takes.append(await buf.take_groups(need, 1))  # ga0 (gold evicted: stale)
        assert need == {"A": 2, "B": 4} and buf.dropped["stale"] == 2
        assert buf.last_filter == (0, {})
        waiter = asyncio.create_task(buf.take_groups(need, 1))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # nothing ready
        await fill(buf, 1, len(order))  # the rest, gb0 first
        takes.append(await asyncio.wait_for(waiter, 5))
        assert need == {"A": 0, "B": 0}
        got = [t.trajectory_id for take in takes for t in take]
        assert got == want == ["ga0-0", "ga0-1", "gb0-0", "gb0-1", "ga1-0", "ga1-1",
                               "gb1-0", "gb1-1"]
        assert buf.ready_by_tag() == {"A": 2, "B": 2}  # ga2 and gb2: not needed

    asyncio.run(main())


def test_discard_all_counts_late_members():
    async def main():
        buf = SampleBuffer(group_size=2)
        await buf.put(traj("a1", "g1"))
        await buf.put(traj("a2", "g1"))
        await buf.put(traj("b1", "g2"))  # g2 still running
        assert not buf.events.wakeup.is_set()
        assert buf.discard_all("surplus") == 3 and buf.events.wakeup.is_set()  # room freed
        await buf.put(traj("b2", "g2", dropped="aborted:surplus"))
        await buf.put(traj("c1", "g3"))  # a new group is unaffected
        assert buf.dropped == {"surplus": 3, "aborted:surplus": 1}
        assert buf.ready_groups == 0 and "g3" in buf._open

    asyncio.run(main())


def test_the_buffer_writes_its_events_and_calls_no_one():
    """What the buffer tells the scheduler goes into the run's RolloutEvents: room freed
    sets ``wakeup``, a group dropped whole is queued (incomplete, then stale), every
    trajectory counted dropped goes to the drop readers; a reader that raises is a side
    error and the count stands."""
    from rollart_sdk.control.events import RolloutEvents

    seen: list[str] = []

    def log_drop(t: Trajectory) -> None:
        seen.append(t.trajectory_id)

    def broken(t: Trajectory) -> None:
        raise OSError("disk full")

    async def main():
        events = RolloutEvents(on_drop=(log_drop, broken))
        buf = SampleBuffer(group_size=2, events=events)
        await buf.put(traj("a1", "g1"))
        await buf.put(traj("a2", "g1", dropped="env_step_failed: boom"))
        assert events.take_dropped_groups() == [("A", "g1")]
        assert events.take_dropped_groups() == []  # drained
        assert not events.wakeup.is_set()  # a dropped group frees no batch room
        await buf.put(traj("b1", "g2", version=0))
        await buf.put(traj("b2", "g2", version=0))
        assert buf.evict_older_than(1) and events.wakeup.is_set()
        assert events.take_dropped_groups() == [("A", "g2")]
        assert seen == ["a2", "a1", "b1", "b2"]
        assert buf.dropped == {"env_step_failed": 1, "group_incomplete": 1, "stale": 2}
        assert events.side_error_count == 4 and "on_drop" in events.side_errors[0]

    asyncio.run(main())


def _naive(buf):
    """What the buffer's counters must say, recomputed from its ready members."""
    members = buf.ready_members()
    groups: dict[str, list[Trajectory]] = {}
    for t in members:
        groups.setdefault(t.group_id, []).append(t)
    by_tag: dict[str, int] = {}
    for t in members:
        by_tag[t.tag] = by_tag.get(t.tag, 0) + 1
    return len(members), by_tag, groups


def test_ready_counts_and_eviction_match_a_full_scan():
    """Random puts, carried-in members, evictions, batches and discards: the kept counts
    and the heap-driven eviction say what a scan of every ready group says, in the same
    order (issue 35: the scans are gone, the accounting is the same)."""
    import random

    async def main():
        rng = random.Random(7)
        buf = SampleBuffer(group_size=2)
        gid = 0
        for _ in range(400):
            op = rng.random()
            if op < 0.55:
                gid += 1
                tag = rng.choice("ABC")
                for i in range(2):
                    await buf.put(traj(f"t{gid}-{i}", f"g{gid}", tag=tag,
                                       version=rng.randrange(10)))
            elif op < 0.65:
                gid += 1
                tag = rng.choice("AB")
                buf.carry_in([traj(f"c{gid}-{i}", f"g{gid}", tag=tag,
                                   version=rng.randrange(10)) for i in range(2)])
            elif op < 0.85:
                floor = rng.randrange(8)
                _, _, groups = _naive(buf)
                want = [t.trajectory_id for g in groups.values()
                        if min(t.start_version for t in g) < floor for t in g]
                assert [t.trajectory_id for t in buf.evict_older_than(floor)] == want
            elif op < 0.97:
                n, _, _ = _naive(buf)
                if n >= 4:
                    batch = await asyncio.wait_for(buf.get_batch(4, min_version=0), 5)
                    firsts: dict[str, int] = {}
                    for t in batch:  # oldest group (its oldest member) first
                        firsts[t.group_id] = min(firsts.get(t.group_id, 99), t.start_version)
                    versions = list(firsts.values())
                    assert len(batch) >= 4 and versions == sorted(versions)
            else:
                buf.discard_all("surplus")
            n, by_tag, groups = _naive(buf)
            assert buf.ready_trajectories == n and buf.ready_by_tag() == by_tag
            assert buf.ready_groups == len(groups)
            assert all(buf.held_by_tag(tag) == by_tag.get(tag, 0) for tag in "ABC")
            assert len(buf._by_version) <= 2 * len(groups) + 64  # compacted, not leaking
        assert gid > 100 and buf.dropped["stale"] > 0

    asyncio.run(main())


def test_arrivals_and_wakeups_do_not_visit_every_ready_group(monkeypatch):
    """With 500 groups ready, each arrival and each eviction check that finds nothing
    older than the floor reads no group's start version (before: every ready group's,
    each a min over its members, on every put and every wake-up of get_batch)."""
    from rollart_sdk.control import buffer as buffer_mod

    reads = []
    plain = buffer_mod.Group.start_version.fget
    monkeypatch.setattr(buffer_mod.Group, "start_version",
                        property(lambda g: reads.append(g.group_id) or plain(g)))

    async def main():
        buf = SampleBuffer(group_size=2)
        for g in range(500):
            await buf.put(traj(f"a{g}", f"g{g}", version=5))
            await buf.put(traj(f"b{g}", f"g{g}", version=5))
        assert len(reads) == 500  # once per group, when it became ready
        reads.clear()
        for _ in range(100):
            assert buf.evict_older_than(5) == []
        assert reads == [] and buf.ready_trajectories == 1000
        assert buf.ready_by_tag() == {"A": 1000}
        assert len(buf.evict_older_than(6)) == 1000 and buf.ready_trajectories == 0

    asyncio.run(main())


class SlowEngine:
    """A real in-process worker object: answers after a delay unless aborted."""

    def __init__(self, name):
        self.name = name
        self.aborted = set()
        self.suspended = False

    async def generate(self, request):
        for _ in range(100):
            if request.request_id in self.aborted:
                return GenerationResult(request.request_id, [], [], [], "abort", worker=self.name)
            await asyncio.sleep(0.01)
        return GenerationResult(request.request_id, [1], [0.0], [0], "stop", worker=self.name)

    async def abort(self, request_id):
        self.aborted.add(request_id)
        return True

    async def suspend(self):
        self.suspended = True

    async def resume(self):
        self.suspended = False


def test_proxy_routes_by_tag_sticks_and_aborts():
    async def main():
        workers = [WorkerHandle(n, SlowEngine(n), pool=p, is_ray=False)
                   for n, p in (("h800-0", "H800"), ("h800-1", "H800"), ("h20-0", "H20"))]
        proxy = LLMProxy(workers, {"FrozenLake": ["h800-0", "h800-1"], "default": ["h20-0"]})
        req = lambda rid, tag, tid: GenerationRequest(rid, [1, 2], tag=tag, trajectory_id=tid)  # noqa: E731
        # Two trajectories at once spread over the two H800 workers; others go to H20.
        r1, r2, r3 = await asyncio.gather(
            proxy.generate(req("t1/0", "FrozenLake", "t1")),
            proxy.generate(req("t2/0", "FrozenLake", "t2")),
            proxy.generate(req("m/0", "Math", "m")),
        )
        assert {r1.worker, r2.worker} == {"h800-0", "h800-1"} and r3.worker == "h20-0"
        # Sticky: t1's next turn goes to the worker holding its prefix.
        again = await proxy.generate(req("t1/1", "FrozenLake", "t1"))
        assert again.worker == r1.worker
        # ABORT reaches the worker holding the request; the caller gets "abort" promptly.
        task = asyncio.create_task(proxy.generate(req("t3/0", "FrozenLake", "t3")))
        await asyncio.sleep(0.05)
        assert await proxy.abort("t3/0")
        assert (await asyncio.wait_for(task, 1)).finish_reason == "abort"
        # Suspended: new requests wait; one aborted while waiting never reaches a worker
        # and returns at once, still suspended (a stop does not wait for the swap).
        await proxy.suspend()
        assert all(w.target.suspended for w in workers)
        waiting = asyncio.create_task(proxy.generate(req("t4/0", "FrozenLake", "t4")))
        held = asyncio.create_task(proxy.generate(req("t5/0", "FrozenLake", "t5")))
        await asyncio.sleep(0.05)
        assert not waiting.done() and not held.done()
        assert not await proxy.abort("t4/0")  # not at a worker yet
        res = await asyncio.wait_for(waiting, 1)
        assert res.finish_reason == "abort" and res.worker == ""
        await asyncio.sleep(0.05)
        assert not held.done()  # the other one still waits for the resume ...
        await proxy.resume()
        assert (await asyncio.wait_for(held, 2)).finish_reason == "stop"  # ... and runs

    asyncio.run(main())


def test_a_stop_while_the_engines_suspend_for_a_swap_resumes_them():
    """The run's task cancelled (SIGTERM, Ctrl-C) while WeightUpdates asks the engines to
    suspend: they are resumed and the proxy admits requests again (left suspended, every
    request waited there and the stop waited 60 s for episodes that could not end)."""
    from rollart_sdk.control.versions import PolicyVersions
    from rollart_sdk.control.weight_updates import WeightUpdates

    class SlowToSuspend(SlowEngine):
        async def suspend(self):
            self.suspended = True  # it stops generating, then takes its time to answer
            await asyncio.sleep(0.5)

    async def main():
        workers = [WorkerHandle("e0", SlowToSuspend("e0"), pool="H800", is_ray=False)]
        proxy = LLMProxy(workers, {"default": ["e0"]})
        w = WeightUpdates(None, proxy, PolicyVersions(), mode="async", alpha=1,  # type: ignore[arg-type]
                          defer=False, log=[], emit=lambda _: None)
        swap = asyncio.create_task(w._swap(None))
        await asyncio.sleep(0.1)  # inside proxy.suspend()
        swap.cancel()
        with pytest.raises(asyncio.CancelledError):
            await swap
        assert proxy._accepting.is_set() and not workers[0].target.suspended
        res = await asyncio.wait_for(proxy.generate(GenerationRequest("r", [1], tag="x")), 5)
        assert res.finish_reason == "stop"

    asyncio.run(main())


def test_proxy_rejects_routes_to_unknown_workers():
    with pytest.raises(ValueError, match="unknown or no workers"):
        LLMProxy([], {"default": ["nope"]})


class DyingEngine(SlowEngine):
    """Dies while an ABORT is on its way: the abort raises Ray's death error."""

    async def abort(self, request_id):
        from ray.exceptions import ActorDiedError

        raise ActorDiedError()


class BrokenAbortEngine(SlowEngine):
    async def abort(self, request_id):
        raise ValueError("engine bug")


def test_proxy_abort_on_a_worker_that_died_marks_it_down_instead_of_raising():
    async def main():
        workers = [WorkerHandle("e0", DyingEngine("e0"), pool="P", is_ray=False)]
        proxy = LLMProxy(workers, {"default": ["e0"]})
        deaths = []
        proxy.on_worker_death.append(lambda name, why: deaths.append((name, why)))
        task = asyncio.create_task(proxy.generate(GenerationRequest("t/0", [1], trajectory_id="t")))
        await asyncio.sleep(0.05)
        assert await proxy.abort("t/0") is False  # nothing left to abort there
        assert "e0" in proxy.down and deaths and deaths[0][0] == "e0"
        assert "ActorDiedError" in proxy.down["e0"]
        assert await proxy.abort("t/0") is False  # a down worker is not asked again
        task.cancel()

        # Any other error of an abort is the engine's bug: raised, not absorbed.
        workers = [WorkerHandle("e1", BrokenAbortEngine("e1"), pool="P", is_ray=False)]
        proxy = LLMProxy(workers, {"default": ["e1"]})
        task = asyncio.create_task(proxy.generate(GenerationRequest("u/0", [1], trajectory_id="u")))
        await asyncio.sleep(0.05)
        with pytest.raises(ValueError, match="engine bug"):
            await proxy.abort("u/0")
        assert not proxy.down
        task.cancel()

    asyncio.run(main())


def test_abort_reaches_a_request_waiting_for_a_restarted_engine():
    # Every engine of the task is down: requests wait for one to come back. An ABORT
    # returns the waiting request at once (before: it sat until the generate timeout and
    # was dropped as generate_timeout instead of with the abort's reason).
    async def main():
        workers = [WorkerHandle("e0", SlowEngine("e0"), pool="P", is_ray=False)]
        proxy = LLMProxy(workers, {"default": ["e0"]})
        proxy.mark_down("e0", "test: process died")
        aborted = asyncio.create_task(proxy.generate(GenerationRequest("a/0", [1], trajectory_id="a")))
        kept = asyncio.create_task(proxy.generate(GenerationRequest("k/0", [1], trajectory_id="k")))
        await asyncio.sleep(0.05)
        assert not aborted.done() and not kept.done()
        assert await proxy.abort("a/0") is False  # not at an engine
        res = await asyncio.wait_for(aborted, 1)
        assert res.finish_reason == "abort" and res.worker == ""
        await asyncio.sleep(0.05)
        assert not kept.done()  # the other waiter still waits for an engine
        proxy.mark_up("e0")
        res = await asyncio.wait_for(kept, 5)
        assert res.finish_reason == "stop" and res.worker == "e0"
        assert not proxy._admitting and not proxy._aborted and not proxy._inflight

    asyncio.run(main())


class DiesLateEngine(SlowEngine):
    """Its first call fails with the death of its process only once released: by then
    the worker was restarted and rejoined (a failure that belongs to the old process)."""

    def __init__(self, name):
        super().__init__(name)
        self.release = asyncio.Event()
        self.calls = 0

    async def generate(self, request):
        self.calls += 1
        if self.calls == 1:
            from ray.exceptions import ActorDiedError

            await self.release.wait()
            raise ActorDiedError()
        return await super().generate(request)


def test_a_late_death_of_the_old_process_does_not_take_the_restarted_one_down():
    async def main():
        engine = DiesLateEngine("e0")
        proxy = LLMProxy([WorkerHandle("e0", engine, pool="P", is_ray=False)], {"default": ["e0"]})
        task = asyncio.create_task(proxy.generate(GenerationRequest("t/0", [1], trajectory_id="t")))
        await asyncio.sleep(0.05)
        proxy.mark_down("e0", "test: died")  # seen by another call; recovery brings it back
        proxy.mark_up("e0")
        engine.release.set()  # now the first call reports the old process's death
        res = await asyncio.wait_for(task, 5)
        assert res.finish_reason == "stop" and res.worker == "e0"  # re-sent and served
        assert "e0" not in proxy.down and proxy.rerouted == 1
        # A death reported by a call sent to the current process still counts.
        engine.calls = 0
        engine.release.set()
        task = asyncio.create_task(proxy.generate(GenerationRequest("u/0", [1], trajectory_id="u")))
        for _ in range(100):
            if "e0" in proxy.down:
                break
            await asyncio.sleep(0.01)
        assert "e0" in proxy.down and not task.done()  # it waits for a restart now
        task.cancel()

    asyncio.run(main())


class KilledByRequestEngine(SlowEngine):
    """Its process dies on every request (a request that kills engines, e.g. OOM)."""

    async def generate(self, request):
        from ray.exceptions import ActorDiedError

        await asyncio.sleep(0.01)
        raise ActorDiedError()


def test_a_request_that_kills_every_engine_is_given_up_after_two_resends():
    from rollart_sdk.control.proxy import MAX_RESENDS, RequestKillsEngines

    async def main():
        names = ["e0", "e1", "e2", "e3"]
        workers = [WorkerHandle(n, KilledByRequestEngine(n), pool="P", is_ray=False) for n in names]
        proxy = LLMProxy(workers, {"default": names})
        with pytest.raises(RequestKillsEngines, match=r"request t/0: its engine died 3 times"):
            await asyncio.wait_for(
                proxy.generate(GenerationRequest("t/0", [1], trajectory_id="t")), 5)
        # Three engines went down with it; the fourth was never sent the request.
        assert len(proxy.down) == MAX_RESENDS + 1 and proxy.rerouted == MAX_RESENDS
        assert proxy.candidates("default") and not proxy._admitting and not proxy._inflight

    asyncio.run(main())


def test_a_group_cut_only_by_a_decision_says_which():
    """Survivors of a group that only the staleness bound (or the run's end, or redundant
    rollout's surplus) cut are that decision's, not a failure's; any failure among the
    cut members makes it a plain ``group_incomplete``."""
    from rollart_sdk.control.buffer import group_incomplete_reason

    assert group_incomplete_reason({"stale", "aborted:stale"}) == "group_incomplete:stale"
    assert group_incomplete_reason({"zero_variance: all 8 rewards of the group are 0"}
                                   ) == "group_incomplete:zero_variance"
    assert group_incomplete_reason({"aborted:run_end",
                                    "run_end: still running when the run stopped"}
                                   ) == "group_incomplete:run_end"
    assert group_incomplete_reason({"aborted:surplus"}) == "group_incomplete:surplus"
    assert group_incomplete_reason({"stale", "env_step_failed: boom"}) == "group_incomplete"
    assert group_incomplete_reason({"stale", "aborted:run_end"}) == "group_incomplete"
