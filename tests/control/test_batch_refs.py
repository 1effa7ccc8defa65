"""Batches reach the trainer ranks as object references (cluster/shards.py, issue 35 item 5).

A 2-rank torch trainer on Ray trains on a fixed batch twice: once with the shards as the
actor calls' arguments (the pipeline before), once with ``shard_batch`` (the pipeline
now). Same metrics, bit-identical weights; and the calls now carry a ``ShardRef`` of a few
hundred bytes where they carried every token.
"""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from rollart_sdk.cluster.handles import WorkerHandle  # noqa: E402
from rollart_sdk.cluster.shards import ShardRef, fetch_shard, shard_batch  # noqa: E402
from rollart_sdk.config import ModelConfig, TinyModelConfig  # noqa: E402
from rollart_sdk.models import prepare_model  # noqa: E402
from rollart_sdk.ray_utils import init_ray  # noqa: E402
from rollart_sdk.resources.decorators import dp_shards  # noqa: E402
from rollart_sdk.types import TrainSample  # noqa: E402

pytestmark = pytest.mark.timeout(600)

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=3)
STEPS = 2


@pytest.fixture(scope="module")
def ray_session():
    torch.set_num_threads(1)
    init_ray(num_cpus=1)
    yield
    ray.shutdown()


class RecordingHandle(WorkerHandle):
    """A real handle that keeps the arguments of every call (what Ray serialises)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls: list[tuple[str, tuple]] = []

    async def call(self, method, *args, **kwargs):
        self.calls.append((method, args))
        return await super().call(method, *args, **kwargs)


def batch(n: int = 24, length: int = 40, vocab: int = 30) -> list[TrainSample]:
    rng = random.Random(5)
    out = []
    for i in range(n):
        prompt = rng.randrange(4, 12)
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [0] * prompt + [1] * (length - prompt)
        lps = [0.0] * prompt + [-rng.random() * 3 for _ in range(length - prompt)]
        vers = [-1] * prompt + [0] * (length - prompt)
        out.append(TrainSample(ids, mask, lps, vers, reward=float(i % 3 == 0),
                               group_id=f"g{i // 4}"))
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(model_dir: str) -> list[RecordingHandle]:
    from rollart_sdk.cluster.roles import TrainerWorker
    from rollart_sdk.cluster.worker import WorkerContext, bound_worker_class
    from rollart_sdk.plugins import load_plugins

    reg = load_plugins().registry
    trainer, transport = reg.get("trainer", "torch"), reg.get("transport", "ray")
    opts = trainer.validate_options({"lr": 0.01, "micro_batch_size": 4})
    cls = ray.remote(bound_worker_class(TrainerWorker))
    init = f"tcp://127.0.0.1:{_port()}"
    actors = [cls.options(num_cpus=0).remote(
        WorkerContext(rank=r, world_size=2, role="actor_train", cluster="train",
                      name=f"train-{r}", binding=None, serverless_urls={}),
        trainer, opts, ModelConfig(path=model_dir), transport,
        transport.validate_options(None), init, 1) for r in range(2)]
    ray.get([a.version.remote() for a in actors], timeout=300)
    return [RecordingHandle(f"train-{r}", a) for r, a in enumerate(actors)]


async def train(handles, samples, by_ref: bool, out: Path) -> list[list[dict]]:
    metrics = []
    for _ in range(STEPS):
        # by_ref: what Pipeline._train sends now; else what it sent before this change.
        shards = shard_batch(samples, handles) if by_ref else dp_shards(samples, len(handles))
        got = await asyncio.gather(*(h.call("train_step", s)
                                     for h, s in zip(handles, shards, strict=True)))
        metrics.append([{k: v for k, v in m.items() if not k.startswith("time/")} for m in got])
    await asyncio.gather(*(h.call("save_pretrained", str(out)) for h in handles))
    return metrics


def same(a, b) -> bool:
    return a == b or (a != a and b != b)  # NaN (a metric with nothing to average) too


def weights(folder: Path) -> dict[str, torch.Tensor]:
    (f,) = folder.glob("*.safetensors")
    return load_file(str(f))


def test_two_ranks_train_bit_identically_from_object_refs(ray_session, tmp_path):
    model_dir = prepare_model(ModelConfig(tiny=TINY), tmp_path / "model", []).path
    samples = batch()
    runs = {}
    for by_ref in (False, True):
        handles = start_ranks(model_dir)
        try:
            out = tmp_path / f"ref{by_ref}"
            runs[by_ref] = (asyncio.run(train(handles, samples, by_ref, out)), weights(out),
                            handles)
        finally:
            for h in handles:
                ray.kill(h.target)
    (m_args, w_args, h_args), (m_refs, w_refs, h_refs) = runs[False], runs[True]
    diff = {(i, r, k, v, m_refs[i][r].get(k)) for i, step in enumerate(m_args)
            for r, m in enumerate(step) for k, v in m.items()
            if not same(v, m_refs[i][r].get(k))}
    assert not diff, sorted(diff)
    assert w_args.keys() == w_refs.keys()
    for name, t in w_args.items():
        assert torch.equal(t, w_refs[name]), name
    assert not torch.equal(w_args[next(iter(w_args))], load_file(
        str(next(Path(model_dir).glob("*.safetensors"))))[next(iter(w_args))]), "no training"

    ctx = ray._private.worker.global_worker.get_serialization_context()

    def sent(handles: list[RecordingHandle]) -> list:
        return [args[0] for h in handles for m, args in h.calls if m == "train_step"]

    before, after = sent(h_args), sent(h_refs)
    assert all(isinstance(a, list) for a in before)
    assert all(isinstance(a, ShardRef) for a in after) and len(after) == 2 * STEPS
    assert {(a.rank, a.world_size, a.samples) for a in after} == {(0, 2, 12), (1, 2, 12)}
    assert after[0].tokens == 12 * 40
    # The bytes Ray serialises for each call's argument: the whole shard before, a
    # reference and five numbers now.
    bytes_before = max(ctx.serialize(a).total_bytes for a in before)
    bytes_after = max(ctx.serialize(a).total_bytes for a in after)
    assert bytes_before > 12 * 40 * 8 and bytes_after < 1_000, (bytes_before, bytes_after)


def test_in_process_handles_get_the_lists_themselves():
    class Plain:
        def train_step(self, shard):
            return fetch_shard(shard)

    samples = batch(5)
    handles = [WorkerHandle(f"t{i}", Plain()) for i in range(2)]
    shards = shard_batch(samples, handles)
    assert shards == dp_shards(samples, 2) and all(isinstance(s, list) for s in shards)
    assert fetch_shard(shards[1]) is shards[1]
    with pytest.raises(ValueError, match="at least one trainer rank"):
        shard_batch(samples, [])


def test_a_shard_sent_to_the_wrong_rank_is_refused(ray_session):
    handles = [WorkerHandle(f"t{i}", None, is_ray=True) for i in range(2)]
    shards = shard_batch(batch(4), handles)
    assert [len(fetch_shard(s, rank=i)) for i, s in enumerate(shards)] == [2, 2]
    with pytest.raises(ValueError, match="rank 1 got the shard of rank 0"):
        fetch_shard(shards[0], rank=1)
