"""One trainer rank for the multi-process tests (imported by torch.multiprocessing)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rollart_sdk.config import ModelConfig
from rollart_sdk.types import TrainSample


def _make(rank: int, world: int, model_dir: str, init: str, options: dict) -> Any:
    from rollart_trainer_megatron.trainer import MegatronTrainer

    return MegatronTrainer(model=ModelConfig(path=model_dir), rank=rank, world_size=world,
                           init_method=init, **options)


def conformance(rank: int, world: int, model_dir: str, init: str, out_dir: str,
                batch: list[TrainSample], options: dict) -> None:
    """``check_trainer`` on every rank, each handed its shard as the pipeline does."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from megatron_helpers import Sharded

    from rollart_sdk.testing.trainer import check_trainer

    first = _make(rank, world, model_dir, init, options)
    made = iter([first])

    def make() -> Any:
        return Sharded(next(made, None) or _make(rank, world, model_dir, init, options))

    report = check_trainer(make, batch, bucket_bytes=8192, workdir=Path(out_dir) / "kit")
    (Path(out_dir) / f"kit{rank}.json").write_text(json.dumps(report))
    first.close()


def steps(rank: int, world: int, model_dir: str, init: str, out_dir: str,
          batch: list[TrainSample], options: dict, n: int) -> None:
    """``n`` steps on this rank's shard; writes metrics and the exported HF weights."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    trainer = _make(rank, world, model_dir, init, options)
    try:
        shard = batch[rank::world]
        metrics = [trainer.train_step(copy.deepcopy(shard)) for _ in range(n)]
        weights = {}
        for b in trainer.export_weights(1 << 30):
            weights.update(b.tensors)
        save_file(weights, str(Path(out_dir) / f"rank{rank}.safetensors"))
        opt = trainer.optimizer
        state_numel = (opt.state_numel() if hasattr(opt, "state_numel") else
                       sum(v.numel() for st in opt.state.values() for k, v in st.items()
                           if k in ("exp_avg", "exp_avg_sq")))
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(
            {"metrics": metrics, "version": trainer.version, "state_numel": state_numel,
             "param_numel": sum(p.numel() for p in trainer.params)}))
    finally:
        trainer.close()
