"""A batch's way to the trainer ranks: one shard per data-parallel rank, by reference.

On Ray the driver puts each rank's shard into the object store once (``ray.put``) and
sends the rank a :class:`ShardRef`: the reference and what the driver knows about the
shard (rank, samples, tokens), a few hundred bytes whatever the batch. The rank fetches
its own shard (:func:`fetch_shard`) straight from the store. Sending the shard itself as
the call's argument (what the pipeline did before) made Ray serialise every token of it
inside the actor call, once per call, with a copy of the arguments held by the call.

In process (``LocalSpawner``, the simulator, unit tests) there is no store: the shard is
passed as the list it is. ``fetch_shard`` takes either.

The ``ShardRef`` wraps the reference on purpose: a bare ``ObjectRef`` passed as an actor
call's argument is resolved by Ray before the method runs, which would hide from the rank
(and from tests) whether it got a reference or a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollart_sdk.resources.decorators import dp_shards
from rollart_sdk.types import TrainSample


@dataclass(frozen=True)
class ShardRef:
    """One data-parallel rank's shard of a batch, in the Ray object store."""

    ref: Any  # ray.ObjectRef of list[TrainSample]
    rank: int
    world_size: int
    samples: int
    tokens: int


Shard = list[TrainSample] | ShardRef


def shard_batch(samples: Sequence[TrainSample], handles: Sequence[Any]) -> list[Shard]:
    """Cut ``samples`` into one shard per handle (the ``dp_split`` rule, ``dp_shards``).
    When every handle is a Ray actor, each shard is put into the object store once and
    its rank gets a :class:`ShardRef`; otherwise the shards are returned as lists."""
    if not handles:
        raise ValueError("shard_batch needs at least one trainer rank")
    shards = dp_shards(samples, len(handles))
    if not all(getattr(h, "is_ray", False) for h in handles):
        return list(shards)
    import ray

    n = len(shards)
    return [ShardRef(ray.put(s), rank=i, world_size=n, samples=len(s),
                     tokens=sum(len(x.input_ids) for x in s))
            for i, s in enumerate(shards)]


def fetch_shard(shard: Shard, rank: int | None = None) -> list[TrainSample]:
    """The samples of ``shard``: fetched from the object store for a :class:`ShardRef`
    (checked against ``rank`` when given), the list itself otherwise."""
    if not isinstance(shard, ShardRef):
        return shard
    if rank is not None and shard.rank != rank:
        raise ValueError(f"trainer rank {rank} got the shard of rank {shard.rank} "
                         f"(of {shard.world_size}): the pipeline must send shard i to rank i")
    import ray

    samples: list[TrainSample] = ray.get(shard.ref)
    if len(samples) != shard.samples:
        raise ValueError(f"shard of rank {shard.rank} holds {len(samples)} samples, its "
                         f"reference says {shard.samples}")
    return samples
