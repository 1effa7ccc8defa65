"""Hugging Face <-> Megatron weight conversion for Llama-family causal LMs (Llama, GQA
Llama, Qwen2/Qwen3), at any tensor-parallel size.

Pure tensor maths, no process groups: :func:`hf_to_megatron` cuts a full HF state dict
into the local shard of TP rank ``tp_rank``; :func:`megatron_to_hf` assembles the HF
tensors of one Megatron parameter from the list of its shards on every TP rank (the
trainer all-gathers them). Layout of Megatron's local layer spec (``get_gpt_layer_local_spec``):

- ``linear_qkv``: per query group ``g`` (KV head), ``[q heads of g; k_g; v_g]`` rows;
  TP rank ``r`` holds query groups ``r * G/tp .. (r + 1) * G/tp - 1``;
- ``linear_fc1``: ``[gate_r; up_r]`` on TP rank ``r`` (the r-th row chunk of each);
- column-parallel weights (qkv, fc1, embedding, output layer) split on dim 0,
  row-parallel ones (``linear_proj``, ``linear_fc2``) on dim 1; norms are replicated;
- the vocabulary is padded to a multiple of ``tp`` (zero rows, dropped on export).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rollart_sdk.backends.model_shape import tensor_parallel_problems


@dataclass(frozen=True)
class Arch:
    """The shape facts of an HF Llama-family config that the conversion needs."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    padded_vocab: int
    tied: bool
    qk_norm: bool
    qkv_bias: bool

    @classmethod
    def from_hf(cls, config: Any, tp: int = 1) -> Arch:
        heads = int(config.num_attention_heads)
        kv = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        model_type = getattr(config, "model_type", "")
        # The rule `rollart validate` checks first (options.py::model_problems).
        problems = tensor_parallel_problems(config.to_dict() if hasattr(config, "to_dict")
                                            else vars(config), tp, "tensor_parallel_size",
                                            replicate_kv=False)
        if problems:
            raise ValueError("; ".join(why for _, why in problems))
        vocab = int(config.vocab_size)
        return cls(
            num_layers=int(config.num_hidden_layers),
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=kv,
            head_dim=head_dim,
            ffn=int(config.intermediate_size),
            vocab=vocab,
            padded_vocab=-(-vocab // tp) * tp,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            qk_norm=model_type.startswith("qwen3"),
            qkv_bias=bool(getattr(config, "attention_bias", False)) or model_type == "qwen2",
        )


# Megatron parameter suffix (under decoder.layers.N.) -> how it is split over TP ranks.
_LAYER_SPLIT = {
    "input_layernorm.weight": None,
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "self_attention.q_layernorm.weight": None,
    "self_attention.k_layernorm.weight": None,
    "self_attention.linear_proj.weight": 1,
    "pre_mlp_layernorm.weight": None,
    "mlp.linear_fc1.weight": 0,
    "mlp.linear_fc2.weight": 1,
}


def megatron_names(arch: Arch) -> list[str]:
    """The Megatron parameter names of ``arch`` in export order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(arch.num_layers):
        for suffix in _LAYER_SPLIT:
            if suffix.endswith("qkv.bias") and not arch.qkv_bias:
                continue
            if "q_layernorm" in suffix or "k_layernorm" in suffix:
                if not arch.qk_norm:
                    continue
            names.append(f"decoder.layers.{i}.{suffix}")
    names.append("decoder.final_layernorm.weight")
    if not arch.tied:
        names.append("output_layer.weight")
    return names


def _pad_vocab(t: torch.Tensor, arch: Arch) -> torch.Tensor:
    if arch.padded_vocab == arch.vocab:
        return t
    pad = t.new_zeros((arch.padded_vocab - arch.vocab, *t.shape[1:]))
    return torch.cat([t, pad])


def _qkv_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Arch) -> torch.Tensor:
    """Interleave HF q/k/v (rows) into Megatron's per-query-group order."""
    per = arch.heads // arch.kv_heads
    d = arch.head_dim
    q = q.reshape(arch.kv_heads, per * d, *q.shape[1:])
    k = k.reshape(arch.kv_heads, d, *k.shape[1:])
    v = v.reshape(arch.kv_heads, d, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


def _qkv_split(full: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, ...]:
    per = arch.heads // arch.kv_heads
    d = arch.head_dim
    g = full.reshape(arch.kv_heads, (per + 2) * d, *full.shape[1:])
    q, k, v = torch.split(g, [per * d, d, d], dim=1)
    rest = full.shape[1:]
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_to_megatron(hf: dict[str, torch.Tensor], arch: Arch, tp: int = 1,
                   tp_rank: int = 0) -> dict[str, torch.Tensor]:
    """The local Megatron state (parameter name -> tensor) of TP rank ``tp_rank``."""

    used: set[str] = set()

    def need(name: str) -> torch.Tensor:
        if name not in hf:
            raise KeyError(f"the Hugging Face checkpoint has no tensor {name!r}")
        used.add(name)
        return hf[name]

    def chunk(t: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.chunk(t, tp, dim=dim)[tp_rank].clone()

    out: dict[str, torch.Tensor] = {}
    emb = _pad_vocab(need("model.embed_tokens.weight"), arch)
    out["embedding.word_embeddings.weight"] = chunk(emb, 0)
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[m + "input_layernorm.weight"] = need(h + "input_layernorm.weight").clone()
        out[m + "pre_mlp_layernorm.weight"] = need(h + "post_attention_layernorm.weight").clone()
        a = h + "self_attn."
        qkv = _qkv_full(need(a + "q_proj.weight"), need(a + "k_proj.weight"),
                        need(a + "v_proj.weight"), arch)
        out[m + "self_attention.linear_qkv.weight"] = chunk(qkv, 0)
        if arch.qkv_bias:
            bias = _qkv_full(need(a + "q_proj.bias"), need(a + "k_proj.bias"),
                             need(a + "v_proj.bias"), arch)
            out[m + "self_attention.linear_qkv.bias"] = chunk(bias, 0)
        if arch.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = need(a + "q_norm.weight").clone()
            out[m + "self_attention.k_layernorm.weight"] = need(a + "k_norm.weight").clone()
        out[m + "self_attention.linear_proj.weight"] = chunk(need(a + "o_proj.weight"), 1)
        gate, up = need(h + "mlp.gate_proj.weight"), need(h + "mlp.up_proj.weight")
        out[m + "mlp.linear_fc1.weight"] = torch.cat([chunk(gate, 0), chunk(up, 0)])
        out[m + "mlp.linear_fc2.weight"] = chunk(need(h + "mlp.down_proj.weight"), 1)
    out["decoder.final_layernorm.weight"] = need("model.norm.weight").clone()
    if not arch.tied:
        out["output_layer.weight"] = chunk(_pad_vocab(need("lm_head.weight"), arch), 0)
    # A tensor no Megatron parameter takes would be silently left out of training and of
    # every exported version (an o_proj or MLP bias, an extra norm): refuse the checkpoint.
    left = sorted(n for n in set(hf) - used
                  if not n.endswith("rotary_emb.inv_freq") and not (arch.tied and n == "lm_head.weight"))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ValueError(f"trainer megatron has no parameter for the checkpoint's "
                         f"{', '.join(left[:5])}{more}: its GPTModel would compute another "
                         "model; use trainer torch")
    return out


def megatron_to_hf(name: str, shards: list[torch.Tensor],  # noqa: C901 - one branch per parameter kind
                   arch: Arch) -> Iterator[tuple[str, torch.Tensor]]:
    """HF tensors of Megatron parameter ``name``, from its shards on TP ranks 0..tp-1
    (a replicated parameter: any one rank's copy, or all of them)."""
    if name == "embedding.word_embeddings.weight":
        # tied: the head is this tensor, sent once (rollart_sdk.weights.without_aliases);
        # engines and HF's loader tie lm_head to it again
        yield "model.embed_tokens.weight", torch.cat(shards)[: arch.vocab]
        return
    if name == "output_layer.weight":
        yield "lm_head.weight", torch.cat(shards)[: arch.vocab]
        return
    if name == "decoder.final_layernorm.weight":
        yield "model.norm.weight", shards[0]
        return
    prefix, _, rest = name.partition(".layers.")
    index, _, suffix = rest.partition(".")
    if prefix != "decoder" or suffix not in _LAYER_SPLIT:
        raise KeyError(f"no Hugging Face name for Megatron parameter {name!r}")
    h = f"model.layers.{index}."
    if suffix == "input_layernorm.weight":
        yield h + "input_layernorm.weight", shards[0]
    elif suffix == "pre_mlp_layernorm.weight":
        yield h + "post_attention_layernorm.weight", shards[0]
    elif suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = _qkv_split(torch.cat(shards), arch)
        yield h + f"self_attn.q_proj.{kind}", q
        yield h + f"self_attn.k_proj.{kind}", k
        yield h + f"self_attn.v_proj.{kind}", v
    elif suffix == "self_attention.q_layernorm.weight":
        yield h + "self_attn.q_norm.weight", shards[0]
    elif suffix == "self_attention.k_layernorm.weight":
        yield h + "self_attn.k_norm.weight", shards[0]
    elif suffix == "self_attention.linear_proj.weight":
        yield h + "self_attn.o_proj.weight", torch.cat(shards, dim=1)
    elif suffix == "mlp.linear_fc1.weight":
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        yield h + "mlp.gate_proj.weight", torch.cat([g for g, _ in halves])
        yield h + "mlp.up_proj.weight", torch.cat([u for _, u in halves])
    elif suffix == "mlp.linear_fc2.weight":
        yield h + "mlp.down_proj.weight", torch.cat(shards, dim=1)


def is_replicated(name: str) -> bool:
    """True for parameters every TP rank holds whole (norms)."""
    if name == "decoder.final_layernorm.weight":
        return True
    _, _, rest = name.partition(".layers.")
    return _LAYER_SPLIT.get(rest.partition(".")[2], 0) is None
