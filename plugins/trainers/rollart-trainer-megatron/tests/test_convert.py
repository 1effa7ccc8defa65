"""HF <-> Megatron conversion: bit-exact round trip at TP 1 and 2 (pure tensor maths),
and the Megatron model's forward equals the HF model's on the converted weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron_helpers import make_checkpoint
from rollart_trainer_megatron.checkpoint import read_hf_weights
from rollart_trainer_megatron.convert import Arch, hf_to_megatron, megatron_names, megatron_to_hf
from transformers import AutoConfig

torch.set_num_threads(1)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("kind,tie", [("llama", False), ("gqa", False), ("gqa", True),
                                      ("qwen3", False)])
def test_round_trip_is_bit_exact(tmp_path: Path, kind: str, tie: bool, tp: int) -> None:
    path = make_checkpoint(tmp_path / kind, kind=kind, tie=tie)
    hf = read_hf_weights(str(path))
    arch = Arch.from_hf(AutoConfig.from_pretrained(path), tp)
    shards = [hf_to_megatron(hf, arch, tp, r) for r in range(tp)]
    assert set(shards[0]) == set(megatron_names(arch))
    if tp == 2:  # really split: each rank holds half of a column-parallel weight
        qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
        assert shards[0][qkv].shape[0] * 2 == shards[1][qkv].shape[0] * 2 == (
            (arch.heads + 2 * arch.kv_heads) * arch.head_dim)
        assert not torch.equal(shards[0][qkv], shards[1][qkv])
    back: dict[str, torch.Tensor] = {}
    for name in megatron_names(arch):
        for hf_name, t in megatron_to_hf(name, [s[name] for s in shards], arch):
            back[hf_name] = t
    if tie:  # the tied head is the embedding, stored and sent once
        assert "lm_head.weight" not in hf and "lm_head.weight" not in back
    assert set(back) == set(hf)
    for name, t in hf.items():
        assert torch.equal(back[name], t), name


def test_qkv_layout_groups_queries_with_their_kv_head(tmp_path: Path) -> None:
    """Megatron's fused qkv rows: per KV group, its query heads, then k, then v."""
    path = make_checkpoint(tmp_path / "gqa", kind="gqa")
    hf = read_hf_weights(str(path))
    arch = Arch.from_hf(AutoConfig.from_pretrained(path), 1)
    qkv = hf_to_megatron(hf, arch)["decoder.layers.1.self_attention.linear_qkv.weight"]
    d, a = arch.head_dim, "model.layers.1.self_attn."
    # group 1 starts after group 0's (2 q heads + k + v) = 4 heads of rows
    assert torch.equal(qkv[4 * d : 6 * d], hf[a + "q_proj.weight"][2 * d : 4 * d])
    assert torch.equal(qkv[6 * d : 7 * d], hf[a + "k_proj.weight"][d : 2 * d])
    assert torch.equal(qkv[7 * d : 8 * d], hf[a + "v_proj.weight"][d : 2 * d])


def test_tp_must_divide_the_kv_heads(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "gqa", kind="gqa")
    with pytest.raises(ValueError, match="tensor_parallel_size=4 does not fit .* 2 key/value heads"):
        Arch.from_hf(AutoConfig.from_pretrained(path), 4)


def test_packing_plan_respects_the_bounds() -> None:
    from rollart_trainer_megatron.packing import plan_micro_batches, plan_rows

    lengths = [5, 9, 3, 12, 4, 4]
    rows = plan_rows(lengths, pack_length=10)
    assert sorted(i for r in rows for i in r) == list(range(6))  # every trajectory, once
    assert rows[0] == [3]  # longer than the bound: a row of its own, longest first
    assert all(sum(lengths[i] for i in r) <= 10 for r in rows[1:])
    assert len(rows) == 4  # 12 | 9 | 5+4 | 4+3 (first-fit decreasing)
    mbs = plan_micro_batches(lengths, pack_length=10, max_tokens=24)
    assert [len(mb) for mb in mbs] == [2, 2]  # 2 x 12 <= 24; then 9 and 9, 7
    mbs = plan_micro_batches(lengths, pack_length=10, max_tokens=100, max_seqs=3)
    assert all(sum(len(r) for r in mb) <= 3 for mb in mbs)
    assert sorted(i for mb in mbs for r in mb for i in r) == list(range(6))


def test_a_checkpoint_with_weights_megatron_has_no_place_for_is_refused(tmp_path: Path) -> None:
    """A Llama with MLP biases: Megatron's local spec has none, so the biases would be
    left out of training and of every exported version; the conversion refuses it, and
    the options say so from the config alone (what `rollart validate` reports)."""
    from rollart_trainer_megatron.options import MegatronTrainerOptions
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, mlp_bias=True)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    hf = read_hf_weights(str(tmp_path / "m"))
    with pytest.raises(ValueError, match=r"no parameter for the checkpoint's "
                       r"model\.layers\.0\.mlp\.down_proj\.bias, "):
        hf_to_megatron(hf, Arch.from_hf(AutoConfig.from_pretrained(tmp_path / "m")))
    options = MegatronTrainerOptions()
    (where, why), = options.model_problems(config.to_dict())
    assert where is None and "mlp_bias" in why and "use trainer torch" in why
    # the same rules as the SDK's own forward for what a Llama decoder does not compute
    mistral = {"model_type": "mistral", "num_attention_heads": 4, "sliding_window": 4096}
    assert ["sliding-window attention"] == [w.split("model's ")[1].split(" is not")[0]
                                            for _, w in options.model_problems(mistral)]
    llama_bias = {"model_type": "llama", "num_attention_heads": 4, "attention_bias": True}
    assert "o_proj bias" in options.model_problems(llama_bias)[0][1]
    qwen2 = {"model_type": "qwen2", "num_attention_heads": 4, "attention_bias": True,
             "layer_types": ["full_attention"] * 2, "use_sliding_window": False}
    assert options.model_problems(qwen2) == []
