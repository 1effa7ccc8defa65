"""Shared-prefix forward (prefix_tree.py): the same loss, gradient and update as the
padded forward, with fewer tokens through the model."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from rollart_trainer_torch.prefix_tree import PrefixTree
from rollart_trainer_torch.trainer import TorchTrainer
from trainer_torch_helpers import behaviour_logprobs, make_tiny_checkpoint
from transformers import AutoModelForCausalLM

from rollart_sdk.config import ModelConfig
from rollart_sdk.types import TrainSample

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def tree_batch(ckpt: Path, seed: int = 0) -> list[TrainSample]:
    """Multi-turn episodes of a deterministic toy env from one shared prompt: actions of
    1-2 tokens from a small set (episodes share turns up to their first different
    action, some are identical), observations whose length depends on the history,
    episodes of 1-3 turns, some ending on an observation (untrained tail), one with no
    trained token at all."""
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    rng = random.Random(seed)
    prompt = [5, 6, 7, 8, 9]
    batch = []
    for i in range(14):
        ids, mask = list(prompt), [0] * len(prompt)
        history: list[int] = []
        for _ in range(rng.choice([1, 2, 3])):
            action = rng.choice([[10], [11], [12, 13]])
            history += action
            ids += action
            mask += [1] * len(action)
            obs = [20 + (sum(history) * 7 + k) % 30 for k in range(2 + sum(history) % 3)]
            ids += obs
            mask += [0] * len(obs)
        if rng.random() < 0.5:  # ends on its action, as the env's last turn does
            del ids[-len(obs):], mask[-len(obs):]
        if i == 13:
            mask = [0] * len(ids)
        lps = behaviour_logprobs(model, ids)
        batch.append(TrainSample(
            input_ids=ids, loss_mask=mask,
            behaviour_logprobs=[lp if m else 0.0 for lp, m in zip(lps, mask, strict=True)],
            token_versions=[0 if m else -1 for m in mask],
            reward=float(rng.random() < 0.5), group_id=f"g{i % 2}"))
    return batch


def _step(ckpt: Path, batch: list[TrainSample], **options: object) -> tuple[dict, dict]:
    t = TorchTrainer(model=ModelConfig(path=str(ckpt)), lr=1e-3, seed=0, num_threads=1,
                     micro_batch_size=64, grad_clip=0.0, **options)
    m = t.train_step(copy.deepcopy(batch))
    return m, {k: v.clone() for k, v in t.model.state_dict().items()}


def test_tree_shares_prefixes_and_reads_each_trained_token_once(ckpt: Path) -> None:
    batch = tree_batch(ckpt)
    tree = PrefixTree.build(batch)
    trained = sum(sum(s.loss_mask[1:]) for s in batch)
    assert len(tree.rows) == trained
    distinct = {tuple(s.input_ids[:max(i for i, m in enumerate(s.loss_mask) if m) ])
                for s in batch if any(s.loss_mask)}
    trie = {seq[:k] for seq in distinct for k in range(1, len(seq) + 1)}
    # Every distinct prefix computed exactly once: the tree's tokens are the trie's nodes.
    assert tree.computed == len(trie) < sum(len(s.input_ids) for s in batch)
    assert [g.start for g in tree.groups] == sorted(g.start for g in tree.groups)


@pytest.mark.parametrize("options", [
    {},
    {"micro_batch_tokens": 30},  # several trees, each its own micro-batch
    {"kl_coef": 0.1},  # the reference model's log-probs through the tree too
    {"loss_agg": "seq-mean"},
], ids=["one-tree", "token-budget", "kl", "seq-mean"])
def test_prefix_tree_matches_the_padded_forward(ckpt: Path, options: dict) -> None:
    batch = tree_batch(ckpt)
    m_pad, w_pad = _step(ckpt, batch, prefix_sharing="off", **options)
    m_tree, w_tree = _step(ckpt, batch, prefix_sharing="on", **options)
    assert m_tree["forward_tokens"] < m_pad["forward_tokens"]
    assert m_pad["grad_norm"] > 1e-3  # the comparison has a gradient to compare
    for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_mean"):
        assert m_tree[key] == pytest.approx(m_pad[key], rel=1e-5, abs=1e-6), key
    assert m_tree["grad_norm"] == pytest.approx(m_pad["grad_norm"], rel=1e-5)
    for k in w_pad:
        assert torch.allclose(w_tree[k], w_pad[k], atol=1e-5, rtol=0), k


def test_auto_takes_the_tree_only_when_it_saves_tokens(ckpt: Path) -> None:
    shared = tree_batch(ckpt)
    t = TorchTrainer(model=ModelConfig(path=str(ckpt)), num_threads=1, micro_batch_size=64)
    assert t._micro_batches(shared)[1]
    rng = random.Random(1)
    distinct = []
    for s in shared:  # no two samples share a first token: nothing to share
        ids = [rng.randrange(1, 64) for _ in s.input_ids]
        distinct.append(TrainSample(ids, s.loss_mask, s.behaviour_logprobs, s.token_versions,
                                    s.reward, s.group_id))
    assert not t._micro_batches(distinct)[1]
    t.options.prefix_sharing = "off"
    assert not t._micro_batches(shared)[1]


def test_gradient_checkpointing_takes_the_padded_forward(ckpt: Path) -> None:
    """prefix_sharing auto with gradient_checkpointing: the padded forward (the tree's KV
    cache is off under checkpointing; this used to raise a TypeError in the step), the
    same update as without checkpointing; "on" with checkpointing is refused up front."""
    from pydantic import ValidationError
    from rollart_trainer_torch.options import TorchTrainerOptions

    batch = tree_batch(ckpt)
    m_ck, w_ck = _step(ckpt, batch, gradient_checkpointing=True)
    m_pad, w_pad = _step(ckpt, batch, prefix_sharing="off")
    assert m_ck["forward_tokens"] == m_pad["forward_tokens"]
    assert m_ck["loss"] == pytest.approx(m_pad["loss"], rel=1e-5, abs=1e-6)
    for k in w_pad:
        assert torch.allclose(w_ck[k], w_pad[k], atol=1e-5, rtol=0), k
    with pytest.raises(ValidationError, match="gradient_checkpointing"):
        TorchTrainerOptions(prefix_sharing="on", gradient_checkpointing=True)
