"""Trainer ``torch`` on a tiny Llama: conformance kit, learning, options and errors."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rollart_trainer_torch.trainer import TorchTrainer
from trainer_torch_helpers import behaviour_logprobs, make_batch, make_tiny_checkpoint, make_trainer
from transformers import AutoModelForCausalLM

from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.interfaces import Trainer
from rollart_sdk.plugins import load_plugins
from rollart_sdk.testing.trainer import check_trainer
from rollart_sdk.types import TrainSample

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def _trainer(path: Path, **options: object) -> TorchTrainer:
    return make_trainer(path, **options)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied-embeddings"])
def test_conformance_kit(tmp_path: Path, tie: bool) -> None:
    path = make_tiny_checkpoint(tmp_path / "model", tie=tie)
    batch = make_batch(path)
    report = check_trainer(lambda: _trainer(path, kl_coef=0.05), batch, bucket_bytes=8192)
    assert report["loss_after"] < report["loss_before"]
    assert report["buckets"] > 1  # the bound was exercised
    m = report["metrics"]
    assert m["tokens"] == sum(sum(s.loss_mask) for s in batch)
    assert m["stale_frac"] == 0.0 and m["clip_frac"] == 0.0  # fresh, on-policy batch
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # engine == trainer numerics
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)  # reference == policy at step 0
    assert m["entropy"] > 0


def test_a_tied_embedding_is_exported_once(tmp_path: Path) -> None:
    """SmolLM2's layout: ``lm_head.weight`` is the embedding. The update carries it once,
    as ``model.embed_tokens.weight`` (17 % fewer bytes on SmolLM2); an untied model
    exports both."""
    for tie in (True, False):
        path = make_tiny_checkpoint(tmp_path / f"model-{tie}", tie=tie)
        trainer = _trainer(path)
        names = [n for b in trainer.export_weights(1 << 30) for n in b.tensors]
        assert "model.embed_tokens.weight" in names
        assert ("lm_head.weight" in names) is (not tie)
        assert len(names) == len(set(names)) == len(trainer.model.state_dict()) - tie


@pytest.mark.parametrize("anchor", ["proximal", "behaviour"])
def test_learns_to_prefer_positive_actions(ckpt: Path, anchor: str) -> None:
    """Same prompt, two actions: reward 1 vs 0. A few steps (on the now stale batch)
    must raise log p(good) and lower log p(bad), with stale tokens anchored either way
    (``stale_anchor``); the TIS weights are checked on the proximal anchor, whose path
    they are (the behaviour anchor clips pi / mu instead: its TIS weight is 1)."""
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompt, good, bad = [3, 4, 5], [10, 11, 12], [20, 21, 22]

    def sample(action: list[int], reward: float) -> TrainSample:
        ids = prompt + action
        mask = [0, 0, 0, 1, 1, 1]
        lps = behaviour_logprobs(model, ids)
        return TrainSample(ids, mask, [lp * m for lp, m in zip(lps, mask, strict=True)],
                           [-1, -1, -1, 0, 0, 0], reward, "g")

    batch = [sample(good, 1.0), sample(bad, 0.0)] * 2
    trainer = _trainer(ckpt, lr=3e-3, stale_anchor=anchor)

    def seq_logprob(action: list[int]) -> float:
        return sum(behaviour_logprobs(trainer.model, prompt + action)[3:])

    start_good, start_bad = seq_logprob(good), seq_logprob(bad)
    metrics = [trainer.train_step(copy.deepcopy(batch)) for _ in range(5)]
    assert trainer.version == 5
    assert seq_logprob(good) > start_good + 0.5
    assert seq_logprob(bad) < start_bad - 0.5
    # steps 2.. train on tokens of version 0: stale, importance-weighted and capped
    assert metrics[0]["stale_frac"] == 0.0
    assert all(m["stale_frac"] == 1.0 for m in metrics[1:])
    if anchor == "behaviour":  # pi / mu clipped: tokens moved past 1 +- eps stop pushing
        assert any(m["clip_frac"] > 0 for m in metrics[1:])
        assert all(m["tis_weight_mean"] == pytest.approx(1.0) for m in metrics[1:])
        return
    assert all(0 < m["tis_weight_mean"] <= 2.0 for m in metrics[1:])
    assert any(m["tis_weight_mean"] != pytest.approx(1.0, abs=1e-3) for m in metrics[1:])
    # ratio_mean is pi / pi_prox: a stale token's anchor is the current weights' own
    # log-prob, so it is exactly 1 from step 2 on; the engine-vs-trainer ratio pi / mu is
    # behaviour_ratio_mean (1 at step 1: the behaviour log-probs are this model's)
    assert all(m["ratio_mean"] == 1.0 for m in metrics[1:])
    assert metrics[0]["behaviour_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    untruncated = 0
    for m in metrics[1:]:
        assert m["behaviour_ratio_mean"] != pytest.approx(1.0, abs=1e-3)
        if m["behaviour_ratio_max"] <= 2.0:  # no weight truncated: the two agree
            assert m["tis_weight_mean"] == pytest.approx(m["behaviour_ratio_mean"], rel=1e-5)
            untruncated += 1
        else:  # some truncated at 2: the mean weight is below the mean ratio
            assert m["tis_weight_mean"] < m["behaviour_ratio_mean"]
    assert untruncated >= 1, [m["behaviour_ratio_max"] for m in metrics[1:]]


def test_micro_batching_gives_the_full_batch_gradient(ckpt: Path) -> None:
    batch = make_batch(ckpt, seed=3)
    weights = []
    for mbs in (1, 8):
        t = _trainer(ckpt, micro_batch_size=mbs, loss_agg="seq-mean", grad_clip=0.0)
        m = t.train_step(copy.deepcopy(batch))
        weights.append((m, {k: v.clone() for k, v in t.model.state_dict().items()}))
    (m1, w1), (m8, w8) = weights
    assert m1["loss"] == pytest.approx(m8["loss"], abs=1e-6)
    assert m1["grad_norm"] == pytest.approx(m8["grad_norm"], rel=1e-4)
    for k in w1:
        assert torch.allclose(w1[k], w8[k], atol=1e-5), k


def _uniform_groups(batch: list[TrainSample], groups: set[str]) -> list[TrainSample]:
    """``batch`` with every sample of ``groups`` given its group's first reward (a group
    that all failed or all succeeded: advantage 0)."""
    first: dict[str, float] = {}
    for s in batch:
        first.setdefault(s.group_id, s.reward)
        if s.group_id in groups:
            s.reward = first[s.group_id]
    return batch


def test_zero_advantage_samples_skipped_with_the_same_update(ckpt: Path) -> None:
    """Samples of uniform groups (advantage 0) are not run through the model, and the
    weights follow the same path as running every sample: the whole batch's token count
    normalises the loss, and AdamW steps even when no sample is left (its momentum
    moves the weights after a batch without signal)."""
    mixed = _uniform_groups(make_batch(ckpt, n_groups=3, seed=5), {"g0"})
    flat = _uniform_groups(make_batch(ckpt, n_groups=3, seed=6), {"g0", "g1", "g2"})
    n_mixed = sum(1 for s in mixed if s.group_id != "g0")
    runs = []
    for skip in (False, True):
        t = _trainer(ckpt, micro_batch_size=64, skip_zero_advantage=skip)
        ms = [t.train_step(copy.deepcopy(b)) for b in (mixed, flat, mixed)]
        runs.append((ms, {k: v.clone() for k, v in t.model.state_dict().items()}))
    (m_all, w_all), (m_skip, w_skip) = runs
    assert [m["forward_sequences"] for m in m_all] == [len(mixed), len(flat), len(mixed)]
    assert [m["forward_sequences"] for m in m_skip] == [n_mixed, 0, n_mixed]
    assert m_skip[1]["forward_tokens"] == 0 and m_skip[1]["grad_norm"] == 0.0
    assert m_skip[0]["tokens"] == m_all[0]["tokens"]  # the whole batch's loss tokens
    for a, b in zip(m_all, m_skip, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5, abs=1e-9)
    for k in w_all:
        assert torch.allclose(w_skip[k], w_all[k], atol=1e-6), k
    before = _trainer(ckpt).model.state_dict()
    moved = [k for k in w_all if not torch.equal(w_all[k], before[k])]
    assert moved  # the comparison compares trained weights
    # With a KL term a zero-advantage sample still has a gradient: every sample runs.
    t = _trainer(ckpt, micro_batch_size=64, kl_coef=0.1)
    assert t.train_step(copy.deepcopy(flat))["forward_sequences"] == len(flat)


def test_head_only_pass_and_token_micro_batches_match_the_full_forward(ckpt: Path) -> None:
    """The one-pass log-probs (LM head on trained positions only, no padding mask) and
    token-sized micro-batches give the same loss, entropy and update as a full forward
    over one padded batch."""
    batch = make_batch(ckpt, n_groups=3, seed=5)
    runs = []
    for head_only, tokens in ((False, 100_000), (True, 100_000), (True, 40)):
        t = _trainer(ckpt, micro_batch_size=64, micro_batch_tokens=tokens, grad_clip=0.0,
                     prefix_sharing="off")
        t._head_only = head_only
        m = t.train_step(copy.deepcopy(batch))
        runs.append((m, {k: v.clone() for k, v in t.model.state_dict().items()},
                     len(t._micro_batches(batch)[0])))
    (m0, w0, n0), *rest = runs
    assert n0 == 1 and rest[1][2] > 2  # the 40-token budget really split the batch
    for m, w, _ in rest:
        assert m["loss"] == pytest.approx(m0["loss"], abs=1e-6)
        assert m["entropy"] == pytest.approx(m0["entropy"], rel=1e-5)
        for k in w0:
            assert torch.allclose(w[k], w0[k], atol=1e-5), k


def test_save_pretrained_loads_with_transformers(ckpt: Path, tmp_path: Path) -> None:
    t = _trainer(ckpt)
    t.train_step(make_batch(ckpt))
    t.save_pretrained(str(tmp_path / "out"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    for k, v in t.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_registered_through_the_entry_point_without_importing_torch() -> None:
    code = (
        "import sys; from rollart_sdk.plugins import load_plugins;"
        "ps = load_plugins(autoload=True, strict=False);"
        "d = ps.registry.get('trainer', 'torch');"
        "assert d.factory == 'rollart_trainer_torch.trainer:TorchTrainer', d;"
        "d.validate_options({'lr': 1e-4, 'loss_agg': 'seq-mean'});"
        "assert 'torch' not in sys.modules, 'registration imported torch'"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_options_errors_name_the_key(ckpt: Path) -> None:
    desc = load_plugins(autoload=True, strict=False).registry.get("trainer", "torch")
    with pytest.raises(ConfigError, match="trainer.options.learning_rate.*allowed keys: lr"):
        desc.validate_options({"learning_rate": 1e-3}, where="trainer.options")
    with pytest.raises(ConfigError, match="trainer.options.loss_agg"):
        desc.validate_options({"loss_agg": "sum"}, where="trainer.options")
    t = desc.create({"lr": 1e-3, "num_threads": 1}, model=ModelConfig(path=str(ckpt)),
                    rank=0, world_size=1, init_method=None)
    assert isinstance(t, Trainer) and t.version == 0


def test_user_errors_say_what_and_how(ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        _trainer(tmp_path)
    with pytest.raises(ValueError, match="needs model.path"):
        TorchTrainer(model=ModelConfig(gguf="x.gguf"))
    with pytest.raises(ValueError, match="init_method"):
        TorchTrainer(model=ModelConfig(path=str(ckpt)), rank=1, world_size=2)
    t = _trainer(ckpt)
    bad = TrainSample([1, 2, 3], [1, 1, 1], [0.0] * 3, [0] * 3, 1.0, "g")
    with pytest.raises(ValueError, match=r"batch\[0\].*loss_mask\[0\] is 1"):
        t.train_step([bad])
    bad = TrainSample([1, 2, 3], [0, 1], [0.0] * 3, [0] * 3, 1.0, "g")
    with pytest.raises(ValueError, match="same length"):
        t.train_step([bad])
    with pytest.raises(FileNotFoundError, match="not a complete torch-trainer checkpoint"):
        t.load_checkpoint(str(tmp_path))


def test_lr_schedule_decays_resumes_and_is_validated(ckpt: Path, tmp_path: Path) -> None:
    """linear over 4 steps: lr 1e-3, 7.5e-4, 5e-4, 2.5e-4, then 0 (weights stay put); a
    trainer loaded from the step-2 checkpoint continues the schedule where it was."""
    batch = make_batch(ckpt)
    t = _trainer(ckpt, lr_schedule="linear", lr_decay_steps=4)
    lrs = []
    for i in range(5):
        if i == 2:
            t.save_checkpoint(str(tmp_path / "at2"))
        if i == 4:
            before = [p.detach().clone() for p in t.params]
        lrs.append(t.train_step(copy.deepcopy(batch))["lr"])
    assert lrs == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4, 0.0])
    assert all(torch.equal(a, b) for a, b in zip(before, t.params, strict=True))
    resumed = _trainer(ckpt, lr_schedule="linear", lr_decay_steps=4)
    resumed.load_checkpoint(str(tmp_path / "at2"))
    assert resumed.train_step(copy.deepcopy(batch))["lr"] == pytest.approx(5e-4)
    desc = load_plugins(autoload=True, strict=False).registry.get("trainer", "torch")
    with pytest.raises(ConfigError, match="lr_decay_steps.*train.steps"):
        desc.validate_options({"lr_schedule": "cosine"}, where="trainer.options")


def _adam_steps(t: TorchTrainer) -> set[int]:
    return {int(st["step"]) for st in t.optimizer.state.values()}


def test_updates_per_batch_steps_adamw_k_times_with_the_first_pass_anchors(ckpt: Path) -> None:
    """updates_per_batch: k AdamW steps on one batch, the policy version +1. The first
    pass is the single-update step exactly (same loss, gradient, metrics); the later passes
    keep its anchors (the behaviour log-probs of this fresh batch), so their ratio is to
    the policy before the batch and PPO's clip bites: with a large lr the last pass clips."""
    batch = make_batch(ckpt, seed=7)
    one = _trainer(ckpt, lr=5e-3, micro_batch_size=2)
    m1 = one.train_step(copy.deepcopy(batch))
    many = _trainer(ckpt, lr=5e-3, micro_batch_size=2, updates_per_batch=4)
    m4 = many.train_step(copy.deepcopy(batch))
    assert many.version == 1 and one.version == 1  # one batch, one version
    assert _adam_steps(one) == {1} and _adam_steps(many) == {4}
    assert m1["updates"] == 1.0 and m4["updates"] == 4.0
    for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "entropy", "tokens"):
        assert m4[key] == pytest.approx(m1[key], rel=1e-6, abs=1e-9), key
    assert m1["clip_frac_last"] != m1["clip_frac_last"]  # nan: no later pass
    assert m4["clip_frac_last"] > 0.0  # moved past 1 +- clip_eps on some tokens
    assert m4["lr"] == m1["lr"] == 5e-3

    # Further along the same direction: the advantage-weighted log-prob of the batch
    # (the policy-gradient objective at the behaviour policy) rose more with 4 updates.
    def objective(t: TorchTrainer) -> float:
        total = 0.0
        samples = copy.deepcopy(batch)
        t._fill_advantages(samples)
        for s in samples:
            lps = behaviour_logprobs(t.model, s.input_ids)
            total += float(s.advantage or 0.0) * sum(
                lp for lp, m in zip(lps, s.loss_mask, strict=True) if m)
        return total

    start = objective(_trainer(ckpt))
    assert objective(one) > start
    assert objective(many) > objective(one) + 1e-3


def test_updates_per_batch_is_validated(ckpt: Path) -> None:
    desc = load_plugins(autoload=True, strict=False).registry.get("trainer", "torch")
    with pytest.raises(ConfigError, match="trainer.options.updates_per_batch"):
        desc.validate_options({"updates_per_batch": 0}, where="trainer.options")
