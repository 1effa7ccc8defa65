"""The slot-cache forward (``SlotRunner.extend``) against each architecture's own full
forward: GQA with tied embeddings, Qwen2's biases, Qwen3's per-head norms, Mistral; on
transformers' modules and on the SDK's own model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rollart_engine_torch.runner import SlotRunner

from rollart_sdk.models import load_causal_lm
from rollart_sdk.testing.trainer import ARCHITECTURES, tiny_arch_checkpoint


@pytest.mark.parametrize("implementation", ["transformers", "native"])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_extend_gives_each_rows_full_forward_logits(tmp_path: Path, name: str,
                                                    implementation: str) -> None:
    """Three sequences in slots 5, 1 and 3 (not the first ones, not in order): a first
    step feeds whole prompts of different lengths; the next steps feed a multi-token
    continuation (a new observation) beside one-token decodes and a new prompt. Every
    row's logits are the full forward's at its last token."""
    path = tiny_arch_checkpoint(tmp_path / name, name)
    model = load_causal_lm(path, implementation=implementation)
    runner = SlotRunner(model, num_slots=8, max_seq_len=64, device="cpu")
    g = torch.Generator().manual_seed(3)
    seqs = {5: torch.randint(1, 61, (30,), generator=g).tolist(),
            1: torch.randint(1, 61, (30,), generator=g).tolist(),
            3: torch.randint(1, 61, (30,), generator=g).tolist()}
    cached = {5: 0, 1: 0, 3: 0}
    steps = [{5: 7, 1: 3}, {5: 1, 1: 6, 3: 9}, {5: 5, 1: 1, 3: 1}, {3: 4, 5: 1}]
    with torch.no_grad():
        full = {s: model(input_ids=torch.tensor([t])).logits[0].float() for s, t in seqs.items()}
    for step in steps:
        slots = list(step)
        chunks = [seqs[s][cached[s]: cached[s] + n] for s, n in step.items()]
        got = runner.extend(slots, chunks, [cached[s] for s in slots])
        assert got is not None and got.shape == (len(slots), 61)
        for row, (s, n) in enumerate(step.items()):
            cached[s] += n
            want = full[s][cached[s] - 1]
            assert (got[row] - want).abs().max() < 1e-4, (name, step, s)
