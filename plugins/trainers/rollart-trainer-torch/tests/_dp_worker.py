"""A data-parallel rank for test_torch_trainer_dp (imported by torch.multiprocessing)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from rollart_sdk.config import ModelConfig
from rollart_sdk.types import TrainSample


def run_rank(
    rank: int, world_size: int, model_dir: str, init_method: str, out_dir: str,
    batch: list[TrainSample], steps: int, options: dict, dtype: str = "float32",
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from rollart_trainer_torch.trainer import TorchTrainer

    trainer = TorchTrainer(
        model=ModelConfig(path=model_dir, dtype=dtype), rank=rank, world_size=world_size,
        init_method=init_method, **options,
    )
    try:
        shard = batch[rank::world_size]  # each rank gets its shard; advantages left unset
        metrics = [trainer.train_step(copy.deepcopy(shard)) for _ in range(steps)]
        state = {k: v.detach().clone().contiguous() for k, v in trainer.model.state_dict().items()}
        if trainer.optimizer.master_weights:  # the fp32 masters too (bfloat16 / float16)
            state.update({f"master.{i}": m.detach().clone()
                          for i, m in enumerate(trainer.optimizer.main_params)})
        save_file(state, str(Path(out_dir) / f"rank{rank}.safetensors"))
        (Path(out_dir) / f"rank{rank}.json").write_text(
            json.dumps({"metrics": metrics, "version": trainer.version})
        )
    finally:
        trainer.close()
