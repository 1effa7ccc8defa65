"""A trainer process for the mooncake transport tests (imported by spawned children)."""

from __future__ import annotations

import os
from typing import Any


def trainer(conn: Any, bucket_bytes: int) -> None:
    """Publishes the versions asked for over ``conn``; its master dies with it."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from rollart_transport_mooncake.transport import MooncakeTransport

    from rollart_sdk.testing.transport import make_state_dict
    from rollart_sdk.weights import split_buckets

    sender = MooncakeTransport("sender", object_mb=0.01)
    while (version := conn.recv()) is not None:
        state = make_state_dict(version)
        conn.send(sender.publish(version, split_buckets(state.items(), bucket_bytes, version)))
    sender.close()
