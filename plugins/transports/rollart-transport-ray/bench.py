"""Micro-benchmark of the "ray" transport: publish in a sender actor, pull + stage + commit
in receiver actors, overlapped or not. Prints figures; asserts nothing about speed.

    OMP_NUM_THREADS=1 python plugins/transports/rollart-transport-ray/bench.py --mb 256
"""

from __future__ import annotations

import argparse
import asyncio
import time

import ray
import torch
from rollart_transport_ray.transport import RayObjectStoreTransport

from rollart_sdk.ray_utils import init_ray
from rollart_sdk.staging import WeightStager
from rollart_sdk.testing.transport import RecordingEngine
from rollart_sdk.weights import split_buckets


@ray.remote(num_cpus=0)
class Sender:
    def __init__(self, mb: int) -> None:
        torch.set_num_threads(1)
        n = mb * 2**20 // 4 // 1024
        self.state = {f"layer.{i}": torch.randn(1024, 1024) for i in range(n // 1024)}
        self.transport = RayObjectStoreTransport("sender")

    def publish(self, version: int, bucket_mb: int) -> tuple:
        t0 = time.perf_counter()
        buckets = split_buckets(self.state.items(), bucket_mb * 2**20, version)
        manifest = self.transport.publish(version, buckets)
        return manifest, time.perf_counter() - t0


@ray.remote(num_cpus=0)
class Receiver:
    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.stager = WeightStager(RayObjectStoreTransport("receiver"))
        self.engine = RecordingEngine()

    async def update(self, manifest, rollout_s: float) -> dict:
        self.stager.start(manifest)
        await asyncio.sleep(rollout_s)  # generation would run here
        report = await self.stager.commit(self.engine, timeout_s=600)
        return {"transfer_s": report.transfer_s, "exposed_s": report.exposed_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128, help="model size in MiB")
    ap.add_argument("--bucket-mb", type=int, default=32)
    ap.add_argument("--receivers", type=int, default=2)
    args = ap.parse_args()
    init_ray(num_cpus=2, object_store_memory=max(4 * args.mb, 512) * 2**20)
    try:
        sender = Sender.remote(args.mb)
        receivers = [Receiver.remote() for _ in range(args.receivers)]
        for version, rollout_s in ((1, 0.0), (2, 0.0), (3, 10.0)):
            manifest, publish_s = ray.get(sender.publish.remote(version, args.bucket_mb))
            reports = ray.get([r.update.remote(manifest, rollout_s) for r in receivers])
            label = "overlapped" if rollout_s else "blocking"
            for i, rep in enumerate(reports):
                print(
                    f"v{version} {label:10s} receiver {i}: {manifest.nbytes / 2**20:.0f} MiB "
                    f"in {len(manifest.buckets)} buckets; publish {publish_s:.2f}s, "
                    f"transfer {rep['transfer_s']:.2f}s "
                    f"({manifest.nbytes / 2**20 / rep['transfer_s']:.0f} MiB/s), "
                    f"exposed {rep['exposed_s']:.3f}s"
                )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
