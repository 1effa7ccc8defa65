"""The trained policy is the sampled one: engine ``torch`` samples at temperature 0.7
among a few allowed ids, trainer ``torch`` recomputes the same distribution, so on
fresh tokens the importance ratio is 1 and the train/inference mismatch is float noise.
The control (the same tokens declared as sampled from the raw logits, which is what both
sides computed before) shows a mismatch the metric cannot miss."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import torch
from rollart_engine_torch.engine import TorchEngine
from rollart_trainer_torch.trainer import TorchTrainer
from trainer_torch_helpers import make_tiny_checkpoint

from rollart_sdk.config import ModelConfig
from rollart_sdk.types import GenerationRequest, SamplingParams, TrainSample

torch.set_num_threads(1)
ALLOWED = [3, 5, 11, 17]


def _rollouts(path: Path, n: int) -> list[TrainSample]:
    """Two-turn episodes: prompt, a constrained action, an observation, another action,
    then a free 4-token answer, all at temperature 0.7 from engine ``torch``."""

    async def run() -> list[TrainSample]:
        engine = TorchEngine(model=ModelConfig(path=str(path)), max_running=8, eos_token_ids=[])
        out = []
        for i in range(n):
            ids, mask, lps = [1, 2, 7, 8 + i % 4], [0, 0, 0, 0], [0.0] * 4
            for turn, allowed in enumerate((ALLOWED, ALLOWED)):
                res = await engine.generate(GenerationRequest(
                    f"r{i}/t{turn}", list(ids), SamplingParams(
                        temperature=0.7, max_new_tokens=1, seed=i * 10 + turn,
                        allowed_token_ids=allowed)))
                ids += res.token_ids + [20 + turn]
                mask += [1, 0]
                lps += res.logprobs + [0.0]
            out.append(TrainSample(ids, mask, lps, [0 if m else -1 for m in mask],
                                   reward=float(i % 2), group_id=f"g{i // 4}",
                                   temperature=0.7, allowed_token_ids=ALLOWED,
                                   engine="torch-0"))
        await engine.shutdown()
        return out

    return asyncio.run(run())


def _mismatch(path: Path, batch: list[TrainSample]) -> dict[str, float]:
    trainer = TorchTrainer(model=ModelConfig(path=str(path)), lr=1e-3, micro_batch_size=4,
                           seed=0, num_threads=1)
    return trainer.train_step(batch)


def test_trainer_recomputes_the_engines_policy(tmp_path: Path) -> None:
    path = make_tiny_checkpoint(tmp_path / "model")
    batch = _rollouts(path, 8)
    assert all(t in ALLOWED for s in batch
               for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m)
    m = _mismatch(path, [dataclasses.replace(s) for s in batch])
    assert m["mismatch_tokens"] == 16.0
    assert m["mismatch_max"] < 1e-4, m
    assert abs(m["behaviour_ratio_mean"] - 1.0) < 1e-4
    # Control: the same tokens, but the trainer told they came from the raw logits.
    raw = [dataclasses.replace(s, temperature=1.0, allowed_token_ids=None) for s in batch]
    c = _mismatch(path, raw)
    assert c["mismatch_max"] > 0.5, c


def test_trainer_reports_the_mass_on_the_allowed_ids(tmp_path: Path) -> None:
    # train/allowed_mass_* are of the weights before the step (the first pass), at the
    # samples' temperature: sum of softmax(logits / 0.7) over ALLOWED at each trained
    # position, computed here with a plain forward. The free samples add nothing.
    path = make_tiny_checkpoint(tmp_path / "model")
    batch = [dataclasses.replace(s, tag="Game") for s in _rollouts(path, 8)]
    free = [dataclasses.replace(s, tag="Chat", allowed_token_ids=None) for s in batch[:4]]
    trainer = TorchTrainer(model=ModelConfig(path=str(path)), lr=1e-3, micro_batch_size=4,
                           seed=0, num_threads=1, skip_zero_advantage=False)
    want = []
    with torch.no_grad():
        for s in batch:
            logits = trainer.model(input_ids=torch.tensor([s.input_ids])).logits[0]
            for pos, m in enumerate(s.loss_mask):
                if m:
                    p = torch.softmax(logits[pos - 1].double() / 0.7, -1)
                    want.append(float(p[ALLOWED].sum()))
    m = trainer.train_step(batch + free)
    assert len(want) == 16
    assert abs(m["allowed_mass_mean"] - sum(want) / 16) < 1e-5, (m, want)
    assert abs(m["allowed_mass_min"] - min(want)) < 1e-5
    assert m["allowed_mass/Game"] == m["allowed_mass_mean"] and "allowed_mass/Chat" not in m
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    assert m["allowed_mass_uniform/Game"] == len(ALLOWED) / vocab
    # no constrained sample: no allowed-mass metric at all
    assert not any(k.startswith("allowed_mass") for k in trainer.train_step(free))


def test_a_task_with_nothing_to_train_is_measured_on_a_few_samples(tmp_path: Path) -> None:
    """Every group uniform (advantage 0, nothing runs through the model): the allowed
    mass is measured forward only on the first MASS_SAMPLES samples, before the step."""
    from rollart_trainer_torch.trainer import MASS_SAMPLES

    path = make_tiny_checkpoint(tmp_path / "model")
    batch = [dataclasses.replace(s, tag="Game", reward=1.0) for s in _rollouts(path, 12)]
    trainer = TorchTrainer(model=ModelConfig(path=str(path)), lr=1e-3, micro_batch_size=64,
                           seed=0, num_threads=1)
    want = []
    with torch.no_grad():
        for s in batch[:MASS_SAMPLES]:
            logits = trainer.model(input_ids=torch.tensor([s.input_ids])).logits[0]
            for pos, m in enumerate(s.loss_mask):
                if m:
                    p = torch.softmax(logits[pos - 1].double() / 0.7, -1)
                    want.append(float(p[ALLOWED].sum()))
    m = trainer.train_step(batch)
    assert m["forward_sequences"] == 0.0 and MASS_SAMPLES < len(batch)
    assert len(want) == 2 * MASS_SAMPLES
    assert abs(m["allowed_mass_mean"] - sum(want) / len(want)) < 1e-5, (m, want)
    assert abs(m["allowed_mass_min"] - min(want)) < 1e-5
