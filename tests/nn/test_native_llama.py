"""rollart_sdk.nn.llama: the SDK's own Llama-family forward against transformers'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rollart_sdk.models import load_causal_lm
from rollart_sdk.nn import llama

torch.set_num_threads(1)

ARCHS = {
    "llama": {},
    "llama-gqa-tied": {"num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "mistral": {"model_type": "mistral", "sliding_window": None},
}


def _checkpoint(tmp: Path, name: str, **over: object) -> Path:
    base = {"model_type": "llama", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 128, "pad_token_id": 0, "rope_theta": 5000.0,
            "rms_norm_eps": 1e-5}
    base.update(ARCHS.get(name, {}))
    base.update(over)
    kind = base.pop("model_type")
    cfg = AutoConfig.for_model(kind, **base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms away from 1 and biases away from 0: every term counts
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
    out = tmp / name
    model.save_pretrained(out)
    return out


@pytest.mark.parametrize("name", list(ARCHS))
def test_logits_gradients_and_cached_forward_match_transformers(tmp_path: Path, name: str) -> None:
    path = _checkpoint(tmp_path, name)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    native = load_causal_lm(path, implementation="native")
    assert isinstance(native, llama.NativeCausalLM)
    assert set(native.state_dict()) == set(hf.state_dict())
    ids = torch.randint(1, 61, (3, 11), generator=torch.Generator().manual_seed(1))
    want = hf(input_ids=ids).logits
    got = native(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-5
    # The gradient of a loss on the logits, parameter by parameter.
    hf.train()
    native.train()
    hf(input_ids=ids).logits.square().mean().backward()
    native(input_ids=ids).logits.square().mean().backward()
    hf_params = dict(hf.named_parameters())
    for n, p in native.named_parameters():
        assert p.grad is not None, n
        assert (p.grad - hf_params[n].grad).abs().max() < 1e-5 * (1 + p.grad.abs().max()), n
    # Cached forward (the trainer's prefix tree): the last 4 positions after the first 7.
    with torch.no_grad():
        full, _ = native.model.forward_kv(ids)
        head, past = native.model.forward_kv(ids[:, :7])
        pos = torch.arange(7, 11).expand(3, -1)
        tail, present = native.model.forward_kv(ids[:, 7:], pos, past)
    assert (torch.cat([head, tail], 1) - full).abs().max() < 1e-5
    assert present[0][0].shape[2] == 11


def test_save_pretrained_loads_in_transformers(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, "llama-gqa-tied")
    native = load_causal_lm(path, implementation="auto")
    assert isinstance(native, llama.NativeCausalLM)
    assert not isinstance(load_causal_lm(path), llama.NativeCausalLM)  # the default: HF's
    with torch.no_grad():
        native.model.norm.weight.mul_(1.5)  # a trained model differs from its source
    native.save_pretrained(tmp_path / "out")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(1, 61, (2, 9))
    assert (back(input_ids=ids).logits - native(input_ids=ids).logits).abs().max() < 1e-5


@pytest.mark.parametrize("over, reason", [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_dropout": 0.1}, "attention_dropout"),
])
def test_unsupported_checkpoints_fall_back_or_say_why(tmp_path: Path, over: dict, reason: str) -> None:
    path = _checkpoint(tmp_path, "llama", **over)
    assert not isinstance(load_causal_lm(path, implementation="auto"), llama.NativeCausalLM)
    with pytest.raises(ValueError, match=f"native cannot load .*{reason}"):
        load_causal_lm(path, implementation="native")


def test_other_architectures_are_not_claimed(tmp_path: Path) -> None:
    cfg = {"model_type": "gpt2", "vocab_size": 10}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert llama.load(tmp_path) is None
    assert "gpt2" in (llama.unsupported_reason(cfg) or "")


def test_loading_does_not_import_transformers(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, "qwen3")
    code = ("import sys; from rollart_sdk.models import load_causal_lm; "
            f"m = load_causal_lm({str(path)!r}, implementation='auto'); "
            "print(type(m).__name__, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["NativeCausalLM", "False"]
