"""Engine-worker processes for the nccl transport tests (imported by spawned children)."""

from __future__ import annotations

import asyncio
import os
from typing import Any


def fingerprints(state: dict[str, Any]) -> dict[str, str]:
    from rollart_sdk.weights import checksum

    return {k: checksum({k: v}) for k, v in state.items()}


def engine_worker(conn: Any, store: str, die_at_broadcast: int | None = None,
                  timeout_s: float = 20.0) -> None:
    """A receiver with a stager in front of a recording engine, driven over ``conn``.

    ``die_at_broadcast``: the process kills itself (no clean-up, like a crash) when it
    enters its N-th broadcast, i.e. in the middle of a version's transfer.
    """
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from rollart_sdk.testing.transport import RecordingEngine
    from rollart_sdk.weights import WeightSyncError

    try:
        from rollart_sdk.weights import WeightStager
    except ImportError:  # before the weights/ package move
        from rollart_sdk.weights import WeightStager
    from rollart_transport_nccl import group
    from rollart_transport_nccl.transport import NcclTransport

    if die_at_broadcast is not None:
        real, calls = group.broadcast, [0]

        def dying(*args: Any, **kwargs: Any) -> None:
            calls[0] += 1
            if calls[0] >= die_at_broadcast:
                os._exit(3)
            real(*args, **kwargs)

        group.broadcast = dying
    transport = NcclTransport("receiver", store=store, timeout_s=timeout_s,
                              join_timeout_s=timeout_s)
    stager = WeightStager(transport)
    engine = RecordingEngine()
    conn.send({"name": transport.name})
    while (manifest := conn.recv()) is not None:
        if isinstance(manifest, tuple):  # ("stage", manifest): start receiving, answer at once
            stager.start(manifest[1])
            conn.send({"staged": manifest[1].version})
            continue
        stager.start(manifest)
        try:
            asyncio.run(stager.commit(engine, timeout_s=4 * timeout_s))
            result: dict[str, Any] = {"ok": True}
        except WeightSyncError as exc:
            result = {"ok": False, "error": str(exc)}
        result.update(version=engine.version, fp=fingerprints(engine.tensors),
                      gen=transport._gen)
        conn.send(result)
    transport.close()
