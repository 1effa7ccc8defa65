"""Trainer ``megatron`` in one process (world size 1, gloo): gradients equal the torch
trainer's, packing, learning, HF export, registration and errors."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from megatron_helpers import behaviour_logprobs, make_batch, make_checkpoint
from rollart_trainer_megatron.convert import megatron_to_hf
from rollart_trainer_megatron.trainer import MegatronTrainer
from rollart_trainer_torch.trainer import TorchTrainer
from transformers import AutoModelForCausalLM

from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.plugins import load_plugins
from rollart_sdk.types import TrainSample

torch.set_num_threads(1)


def _trainer(path: Path, **options: object) -> MegatronTrainer:
    opts = {"lr": 1e-3, "seed": 0, "num_threads": 1, **options}
    return MegatronTrainer(model=ModelConfig(path=str(path)), **opts)


def _capture_grads(trainer: object) -> dict:
    """Replace the optimiser step with a copy of the gradients it would apply."""
    grads: dict = {}

    def step(*_a: object, **_k: object) -> None:
        for group in trainer.optimizer.param_groups:  # type: ignore[attr-defined]
            for p in group["params"]:
                grads[id(p)] = p.grad.detach().clone()

    trainer.optimizer.step = step  # type: ignore[attr-defined]
    return grads


@pytest.mark.parametrize("kind,tie", [("gqa", False), ("gqa", True), ("qwen3", False)])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_loss_and_gradients_match_the_torch_trainer(tmp_path: Path, kind: str, tie: bool,
                                                    agg: str) -> None:
    ckpt = make_checkpoint(tmp_path / "m", kind=kind, tie=tie)
    batch = make_batch(ckpt, n_groups=3, group_size=4, seed=2)
    common = {"lr": 1e-3, "seed": 0, "num_threads": 1, "kl_coef": 0.1, "loss_agg": agg,
              "grad_clip": 0.0}
    ref = TorchTrainer(model=ModelConfig(path=str(ckpt)), micro_batch_size=5, **common)
    meg = _trainer(ckpt, pack_length=30, max_tokens_per_micro_batch=64, **common)
    ref_grads, meg_grads = _capture_grads(ref), _capture_grads(meg)
    m_ref = ref.train_step(copy.deepcopy(batch))
    m_meg = meg.train_step(copy.deepcopy(batch))
    assert m_meg["micro_batches"] > 1
    assert m_meg["loss"] == pytest.approx(m_ref["loss"], abs=1e-4)
    assert m_meg["grad_norm"] == pytest.approx(m_ref["grad_norm"], rel=1e-4)
    want = {n: ref_grads[id(p)] for n, p in ref.model.named_parameters()}
    got = {}
    for name, p in meg.named_params.items():
        got.update(megatron_to_hf(name, [meg_grads[id(p)]], meg.arch))
    assert set(want) <= set(got)
    for name, g in want.items():
        err = (got[name] - g).abs().max().item()
        assert err < 1e-4, f"gradient of {name} differs by {err:.3g}"
    assert max(g.abs().max().item() for g in want.values()) > 1e-3  # not all ~0


def test_the_sampled_policy_matches_the_torch_trainer(tmp_path: Path) -> None:
    """Samples drawn at temperature 0.7, half of them among a few allowed ids: both
    trainers recompute the same policy (softmax(mask(logits) / T)), so loss, KL and
    gradients agree; the raw-logit loss on the same tokens differs (the control)."""
    ckpt = make_checkpoint(tmp_path / "m", kind="qwen3")
    batch = make_batch(ckpt, n_groups=3, group_size=4, seed=5)
    for i, s in enumerate(batch):
        s.temperature = 0.7
        if i % 2:
            trained = {t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m}
            s.allowed_token_ids = sorted(trained | {1, 2, 3})
    common = {"lr": 1e-3, "seed": 0, "num_threads": 1, "kl_coef": 0.1, "grad_clip": 0.0}
    ref = TorchTrainer(model=ModelConfig(path=str(ckpt)), micro_batch_size=5, **common)
    meg = _trainer(ckpt, pack_length=30, max_tokens_per_micro_batch=64, **common)
    ref_grads, meg_grads = _capture_grads(ref), _capture_grads(meg)
    m_ref = ref.train_step(copy.deepcopy(batch))
    m_meg = meg.train_step(copy.deepcopy(batch))
    assert m_meg["micro_batches"] > 1
    for key in ("loss", "kl", "entropy"):
        assert m_meg[key] == pytest.approx(m_ref[key], abs=1e-4), key
    want = {n: ref_grads[id(p)] for n, p in ref.model.named_parameters()}
    got = {}
    for name, p in meg.named_params.items():
        got.update(megatron_to_hf(name, [meg_grads[id(p)]], meg.arch))
    for name, g in want.items():
        err = (got[name] - g).abs().max().item()
        assert err < 1e-4, f"gradient of {name} differs by {err:.3g}"
    raw = [copy.deepcopy(s) for s in batch]
    for s in raw:
        s.temperature, s.allowed_token_ids = 1.0, None
    m_raw = _trainer(ckpt, pack_length=30, max_tokens_per_micro_batch=64,
                     **common).train_step(raw)
    assert abs(m_raw["entropy"] - m_meg["entropy"]) > 0.1


@pytest.mark.parametrize("kind", ["gqa", "qwen3"])
def test_the_rope_base_is_the_models(tmp_path: Path, kind: str) -> None:
    """Megatron's log-probs are the HF model's on a checkpoint saved by transformers 5,
    whose rope base (100,000 / 1,000,000 here, as SmolLM2's / Qwen3's) is in
    ``rope_parameters`` and no longer ``config.rope_theta``: read from the attribute
    alone it was the default 10,000 (SmolLM2 at TP 3: 0.26 nats per token of mismatch
    against the engine). The query and key weights are scaled so that attention is sharp
    and the rotation counts; the control: the same model with the default base."""
    from transformers import AutoConfig

    ckpt = make_checkpoint(tmp_path / "m", kind=kind)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(30.0)
    model.save_pretrained(ckpt)
    conf = AutoConfig.from_pretrained(ckpt)
    assert not hasattr(conf, "rope_theta") and conf.rope_parameters["rope_theta"] > 1e4

    def mismatch(path: Path) -> float:
        batch = make_batch(path, n_groups=2, group_size=4, seed=3)
        return _trainer(path).train_step(batch)["mismatch_mean"]

    assert mismatch(ckpt) < 1e-5
    conf.rope_parameters["rope_theta"] = 10000.0
    conf.save_pretrained(ckpt)
    wrong = tmp_path / "default-base"
    model.config = conf
    model.save_pretrained(wrong)
    # behaviour log-probs of the default-base model, trained by the real base: the control
    batch = make_batch(wrong, n_groups=2, group_size=4, seed=3)
    conf.rope_parameters["rope_theta"] = 1e6 if kind == "qwen3" else 1e5
    conf.save_pretrained(ckpt)
    assert _trainer(ckpt).train_step(batch)["mismatch_mean"] > 1e-3


def test_packing_does_not_change_the_step(tmp_path: Path) -> None:
    """One trajectory per forward vs rows of several stacked in one forward: same loss,
    same gradients."""
    ckpt = make_checkpoint(tmp_path / "m", kind="qwen3")
    batch = make_batch(ckpt, seed=4)
    results = []
    for pack_length, budget in ((2, 2), (25, 10_000)):
        t = _trainer(ckpt, pack_length=pack_length, max_tokens_per_micro_batch=budget,
                     grad_clip=0.0)
        grads = _capture_grads(t)
        m = t.train_step(copy.deepcopy(batch))
        results.append((m, [grads[id(p)] for p in t.params]))
    (m1, g1), (m2, g2) = results
    assert m1["micro_batches"] == m1["packed_rows"] == len(batch)
    assert m2["micro_batches"] == 1 and 1 < m2["packed_rows"] < len(batch)
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_learns_to_prefer_positive_actions(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "m", kind="gqa")
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompt, good, bad = [3, 4, 5], [10, 11, 12], [20, 21, 22]

    def sample(action: list[int], reward: float) -> TrainSample:
        ids, mask = prompt + action, [0, 0, 0, 1, 1, 1]
        lps = behaviour_logprobs(model, ids)
        return TrainSample(ids, mask, [lp * m for lp, m in zip(lps, mask, strict=True)],
                           [-1, -1, -1, 0, 0, 0], reward, "g")

    batch = [sample(good, 1.0), sample(bad, 0.0)] * 2
    # the TIS path (stale tokens anchored at the proximal weights), as trainer torch's test
    t = _trainer(ckpt, lr=3e-3, stale_anchor="proximal")
    metrics = [t.train_step(copy.deepcopy(batch)) for _ in range(5)]
    t.save_pretrained(str(tmp_path / "out"))
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()

    def seq_lp(m: torch.nn.Module, action: list[int]) -> float:
        return sum(behaviour_logprobs(m, prompt + action)[3:])

    assert seq_lp(after, good) > seq_lp(model, good) + 0.5
    assert seq_lp(after, bad) < seq_lp(model, bad) - 0.5
    assert t.version == 5 and all(m["stale_frac"] == 1.0 for m in metrics[1:])
    # the engine-vs-trainer ratio pi / mu, as trainer torch reports it: 1 at step 1 (the
    # behaviour log-probs are this model's), then the TIS weight while none is truncated
    assert metrics[0]["behaviour_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics[0]["behaviour_ratio_max"] == pytest.approx(1.0, abs=1e-4)
    for m in metrics[1:]:
        assert m["behaviour_ratio_mean"] != pytest.approx(1.0, abs=1e-3)
        assert m["behaviour_ratio_max"] >= m["behaviour_ratio_mean"]
        if m["behaviour_ratio_max"] <= 2.0:  # no weight truncated (tis_cap 2): the two agree
            assert m["tis_weight_mean"] == pytest.approx(m["behaviour_ratio_mean"], rel=1e-5)


def test_train_refuses_a_parallel_size_the_model_does_not_split_by(tmp_path: Path) -> None:
    """`rollart train` with TP 2 on a model of 3 heads (SmolLM2 has 9 over 3 K/V heads):
    one config error at the option before Ray starts, no run directory (it used to be a
    ValueError from inside the trainer actor's constructor, 15 s in); PP that does not
    divide the layers likewise."""
    from rollart_sdk.testing.dists import run_cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""\
model:
  tiny: {{hidden_size: 36, num_heads: 3, num_layers: 3}}
roles:
  actor_train: {{workers: 2}}
trainer: {{name: megatron, options: {{tensor_parallel_size: 2}}}}
tasks:
  - tag: FrozenLake
    env: {{name: frozenlake}}
    max_turns: 2
rollout: {{batch_size: 4, group_size: 2}}
output_dir: {tmp_path / "runs"}
""")
    res = run_cli("train", str(cfg), "--no-progress")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    err = " ".join(res.stderr.split())
    assert ("trainer.options.tensor_parallel_size (line 5): trainer 'megatron': "
            "tensor_parallel_size=2 does not divide the model's 3 attention heads") in err, err
    assert not (tmp_path / "runs").exists() or not [
        p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    res = run_cli("validate", str(cfg), "trainer.options={tensor_parallel_size: 1, "
                  "pipeline_parallel_size: 2}")
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and ("pipeline_parallel_size=2 must divide the model's 3 "
                                    "layers") in err, err


def test_save_pretrained_copies_tokenizer_side_files(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "m", kind="qwen3", tie=True)
    (ckpt / "tokenizer_config.json").write_text("{}")
    t = _trainer(ckpt)
    t.save_pretrained(str(tmp_path / "out"))
    assert (tmp_path / "out" / "tokenizer_config.json").read_text() == "{}"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    src = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    for k, v in src.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_registered_through_the_entry_point_without_importing_megatron() -> None:
    code = (
        "import sys; from rollart_sdk.plugins import load_plugins;"
        "ps = load_plugins(autoload=True, strict=False);"
        "d = ps.registry.get('trainer', 'megatron');"
        "assert d.factory == 'rollart_trainer_megatron.trainer:MegatronTrainer', d;"
        "d.validate_options({'tensor_parallel_size': 2, 'loss_agg': 'seq-mean'});"
        "assert 'megatron' not in sys.modules and 'torch' not in sys.modules"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_errors_say_what_and_how(tmp_path: Path) -> None:
    desc = load_plugins(autoload=True, strict=False).registry.get("trainer", "megatron")
    with pytest.raises(ConfigError, match="pipeline_parallel_size"):
        desc.validate_options({"pipeline_parallel_size": 0}, where="trainer.options")
    desc.validate_options({"pipeline_parallel_size": 2, "use_distributed_optimizer": True},
                          where="trainer.options")
    with pytest.raises(ConfigError, match="trainer.options.max_tokens"):
        desc.validate_options({"max_tokens": 2}, where="trainer.options")
    ckpt = make_checkpoint(tmp_path / "m", kind="gqa")
    with pytest.raises(ValueError, match="not a multiple of trainer.options.tensor_parallel"):
        MegatronTrainer(model=ModelConfig(path=str(ckpt)), rank=0, world_size=3,
                        tensor_parallel_size=2)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        _trainer(tmp_path)
    t = _trainer(ckpt)
    with pytest.raises(ValueError, match=r"batch\[0\].*loss_mask\[0\] is 1"):
        t.train_step([TrainSample([1, 2, 3], [1, 1, 1], [0.0] * 3, [0] * 3, 1.0, "g")])
    with pytest.raises(FileNotFoundError, match="not a complete megatron-trainer checkpoint"):
        t.load_checkpoint(str(tmp_path))


def test_lr_schedule_follows_the_torch_trainers(tmp_path: Path) -> None:
    """Same options, same learning rates per step as trainer torch (cosine with warm-up),
    and the same weights after the steps; lr 0 at the end of a linear decay moves nothing."""
    ckpt = make_checkpoint(tmp_path / "m", kind="gqa")
    batch = make_batch(ckpt, seed=1)
    sched = {"lr_schedule": "cosine", "lr_warmup_steps": 1, "lr_decay_steps": 4,
             "lr_min_ratio": 0.1, "grad_clip": 0.0}
    ref = TorchTrainer(model=ModelConfig(path=str(ckpt)), lr=1e-3, seed=0, num_threads=1,
                       micro_batch_size=64, **sched)
    meg = _trainer(ckpt, **sched)
    lr_ref = [ref.train_step(copy.deepcopy(batch))["lr"] for _ in range(5)]
    lr_meg = [meg.train_step(copy.deepcopy(batch))["lr"] for _ in range(5)]
    assert lr_meg == pytest.approx(lr_ref)
    # warm-up step, then 0.1 + 0.9 * (1 + cos(pi * k / 3)) / 2 for k = 0..3
    assert lr_meg == pytest.approx([1e-3, 1e-3, 7.75e-4, 3.25e-4, 1e-4])
    lin = _trainer(ckpt, lr_schedule="linear", lr_decay_steps=1)
    lin.train_step(copy.deepcopy(batch))
    before = [p.detach().clone() for p in lin.params]
    assert lin.train_step(copy.deepcopy(batch))["lr"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, lin.params, strict=True))


def test_a_failed_save_leaves_the_earlier_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """The save writes beside the folder and renames it in when complete: a save that
    fails part-way (a full disk) leaves the earlier checkpoint loadable and no leftover."""
    import errno

    from megatron.core import dist_checkpointing

    ckpt = make_checkpoint(tmp_path / "m", kind="gqa")
    batch = make_batch(ckpt, seed=1)
    t = _trainer(ckpt)
    t.train_step(copy.deepcopy(batch))
    out = tmp_path / "ck"
    t.save_checkpoint(str(out))
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    t.train_step(copy.deepcopy(batch))
    real = dist_checkpointing.save

    def full_disk(state: object, path: str, *a: object, **kw: object) -> None:
        (Path(path) / "torn").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dist_checkpointing, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        t.save_checkpoint(str(out))
    monkeypatch.setattr(dist_checkpointing, "save", real)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "m"]  # no leftover
    fresh = _trainer(ckpt)
    fresh.load_checkpoint(str(out))
    assert fresh.version == 1
    t.save_checkpoint(str(out))  # a later save replaces it whole
    again = _trainer(ckpt)
    again.load_checkpoint(str(out))
    assert again.version == 2
