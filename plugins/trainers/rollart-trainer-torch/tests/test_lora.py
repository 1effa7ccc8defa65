"""LoRA in trainer ``torch`` (trainer.options.lora) on a tiny Llama: only the adapters
train and travel, a checkpoint holds the adapters and AdamW and resumes exactly,
final_model is a peft adapter folder (plus the merged model on request), and two
data-parallel ranks train the adapter one trainer does.

SmolLM2 (an engine serving the adapter = the trainer's merged model; payload size):
``test_lora_smollm2.py``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from rollart_trainer_torch.trainer import TorchTrainer
from trainer_torch_helpers import make_batch, make_tiny_checkpoint

from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.models import load_causal_lm
from rollart_sdk.plugins import load_plugins
from rollart_sdk.weights.lora import split_adapter

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'rollart-trainer-torch[lora]'")
torch.set_num_threads(1)
LORA = {"rank": 4, "alpha": 8.0}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), tie=True)


def _trainer(path: Path, impl: str = "auto", **options: object) -> TorchTrainer:
    opts = {"lr": 1e-2, "micro_batch_size": 3, "seed": 0, "num_threads": 1, "lora": LORA,
            **options}
    return TorchTrainer(model=ModelConfig(path=str(path), implementation=impl), **opts)


def _adapter(t: TorchTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.model.named_parameters() if ".lora_" in k}


@pytest.mark.parametrize("impl", ["native", "transformers"])
def test_only_the_adapters_train_and_travel(ckpt: Path, impl: str) -> None:
    t = _trainer(ckpt, impl)
    base = {k: v.clone() for k, v in t.model.state_dict().items() if ".lora_" not in k}
    assert t.params and all(".lora_" in n for n, p in t.model.named_parameters()
                            if p.requires_grad)
    t.train_step(make_batch(ckpt))
    after = t.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # the base is frozen
    full, pairs = split_adapter({k: v for b in t.export_weights(1 << 20)
                                 for k, v in b.tensors.items()})
    assert not full and len(pairs) == 2 * 7  # 2 layers x 7 projections
    w = "model.layers.1.mlp.down_proj.weight"
    layer = t.model.model.layers[1].mlp.down_proj
    a, b = pairs[w]
    assert torch.equal(a, layer.lora_A["default"].weight)
    torch.testing.assert_close(b, layer.lora_B["default"].weight * (8.0 / 4))
    assert float(b.abs().max()) > 0  # one step moved B off its zero start


def test_checkpoint_resume_round_trip(ckpt: Path, tmp_path: Path) -> None:
    """Two steps, save, a third; a fresh trainer loaded from the save takes the same third
    step (adapters, AdamW moments, version and step restored), and the checkpoint holds
    the adapters, not the model."""
    batches = [make_batch(ckpt, seed=s) for s in range(3)]
    t = _trainer(ckpt)
    for b in batches[:2]:
        t.train_step(copy.deepcopy(b))
    t.save_checkpoint(str(tmp_path / "ck"))
    saved = _adapter(t)
    m1 = t.train_step(copy.deepcopy(batches[2]))
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert "adapter.safetensors" in files and "model.safetensors" not in files

    r = _trainer(ckpt)
    r.load_checkpoint(str(tmp_path / "ck"))
    assert r.version == 2
    assert all(torch.equal(saved[k], v) for k, v in _adapter(r).items())
    m2 = r.train_step(copy.deepcopy(batches[2]))
    assert m2["loss"] == m1["loss"] and m2["grad_norm"] == m1["grad_norm"]
    assert all(torch.equal(_adapter(t)[k], v) for k, v in _adapter(r).items())

    # A full-model checkpoint is not an adapter checkpoint, and the other way round.
    with pytest.raises(ValueError, match="holds LoRA adapters but this trainer trains a full"):
        TorchTrainer(model=ModelConfig(path=str(ckpt)), num_threads=1).load_checkpoint(
            str(tmp_path / "ck"))
    with pytest.raises(ValueError, match="missing.*same lora.rank"):
        _trainer(ckpt, lora={"rank": 4, "target_modules": ["q_proj"]}).load_checkpoint(
            str(tmp_path / "ck"))


def test_final_model_is_a_peft_adapter_and_merged_on_request(ckpt: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    t = _trainer(ckpt, lora={**LORA, "save_merged": True})
    batch = make_batch(ckpt)
    t.train_step(batch)
    t.save_pretrained(str(tmp_path / "final"))
    assert (tmp_path / "final" / "adapter_config.json").is_file()
    ids = torch.tensor([batch[0].input_ids])
    t.model.eval()
    with torch.no_grad():
        want = t.model(input_ids=ids).logits
        peft_model = PeftModel.from_pretrained(load_causal_lm(str(ckpt), "float32"),
                                               str(tmp_path / "final"))
        got_peft = peft_model(input_ids=ids).logits
        got_merged = load_causal_lm(str(tmp_path / "final" / "merged"))(input_ids=ids).logits
        base = load_causal_lm(str(ckpt))(input_ids=ids).logits
    torch.testing.assert_close(got_peft, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_merged, want, atol=1e-5, rtol=0)
    assert float((want - base).abs().max()) > 1e-4  # the adapter does change the model


def test_lora_options_are_validated(ckpt: Path) -> None:
    desc = load_plugins(autoload=True, strict=False).registry.get("trainer", "torch")
    with pytest.raises(ConfigError, match="trainer.options.lora.rank"):
        desc.validate_options({"lora": {"rank": 0}}, where="trainer.options")
    with pytest.raises(ConfigError, match="trainer.options.lora.ranks"):
        desc.validate_options({"lora": {"ranks": 8}}, where="trainer.options")
    with pytest.raises(ValueError, match=r"\['qkv'\] name no linear layer.*'down_proj'"):
        _trainer(ckpt, lora={"target_modules": ["qkv"]})


@pytest.mark.slow  # two spawned ranks: about a minute on the shared CPU
def test_two_ranks_train_the_same_adapter_as_one(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Data parallel (gloo): both ranks hold rank 0's adapters and end equal to a single
    trainer on the whole batch; with a KL term, whose frozen reference is the base."""
    import json

    import torch.multiprocessing as mp
    from _dp_worker import run_rank
    from safetensors.torch import load_file

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = make_tiny_checkpoint(tmp_path / "model", tie=True)
    batch = make_batch(ckpt, n_groups=3, group_size=4, seed=5)
    options = {"lr": 1e-2, "micro_batch_size": 2, "seed": 0, "num_threads": 1,
               "kl_coef": 0.1, "lora": LORA}
    single = TorchTrainer(model=ModelConfig(path=str(ckpt)), **options)
    metrics = [single.train_step(copy.deepcopy(batch)) for _ in range(2)]
    want = _adapter(single)
    mp.spawn(run_rank, args=(2, str(ckpt), f"file://{tmp_path / 'dist-init'}", str(tmp_path),
                             batch, 2, options), nprocs=2, join=True)
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    for name, tensor in want.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name
        torch.testing.assert_close(ranks[0][name], tensor, atol=2e-5, rtol=0)
    info = json.loads((tmp_path / "rank0.json").read_text())
    assert info["metrics"][1]["loss"] == pytest.approx(metrics[1]["loss"], rel=1e-4, abs=1e-6)
    assert metrics[1]["kl"] > 0  # the adapter moved away from the base reference
