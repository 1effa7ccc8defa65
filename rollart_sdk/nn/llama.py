"""A Llama-family causal LM in plain torch, loaded from a Hugging Face checkpoint folder.

Why: importing transformers' model classes costs about 2 s on a small CPU machine (they
pull in ``torch._dynamo``, ``torch.distributed.tensor`` and scipy), which is most of a
small run's start-up (issue 12). The torch engine and the torch trainer only need the
forward pass of a few architectures, so :func:`load` builds it here from ``config.json``
and ``model.safetensors`` - no transformers import - when the checkpoint is one this module
computes exactly, and returns None otherwise (callers then use transformers).

What it covers: ``model_type`` llama, mistral (without sliding-window attention), qwen2
(q/k/v biases) and qwen3 (per-head q/k RMSNorm); the default rotary embedding (no
``rope_scaling``); SiLU MLP; no attention dropout; tied or untied embeddings. Parameter
names, shapes and the forward are those of transformers' ``*ForCausalLM`` (the tests check
the logits against it to 1e-5 and the gradients too), so weights move between the two
freely (``save_pretrained`` writes a folder ``AutoModelForCausalLM`` loads).

The module tree mirrors transformers' (``model.layers[i].self_attn.q_proj``,
``model.rotary_emb``, ``lm_head``, ...), so code written against those modules - the torch
engine's slot-cache forward - runs on either. Its own cached forward for training
(:meth:`NativeModel.forward_kv`) takes and returns per-layer K/V tensors.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from rollart_sdk.backends.model_shape import architecture_problems, rope_settings

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_SIDE_FILES = ("generation_config.json",)


def unsupported_reason(cfg: dict[str, Any]) -> str | None:
    """Why this module cannot compute the checkpoint exactly (None: it can)."""
    problems = architecture_problems(cfg, SUPPORTED)
    return problems[0] if problems else None


class TreeGroup(Protocol):
    """One group of a prefix tree, as :meth:`NativeModel.forward_tree` reads it."""

    rows: int
    length: int
    start: int
    parents: torch.Tensor | None


class Linear(nn.Linear):
    """``nn.Linear`` whose parameters are left uninitialised: they come from the checkpoint
    (no RNG drawn, no time spent)."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.inv_freq = nn.Buffer(inv, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device, torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, inter, bias=bias)
        self.up_proj = Linear(hidden, inter, bias=bias)
        self.down_proj = Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.head_dim = c.head_dim
        self.scaling = c.head_dim ** -0.5
        qkv_bias = c.model_type == "qwen2" or c.attention_bias
        o_bias = c.attention_bias and c.model_type != "qwen2"
        self.q_proj = Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=qkv_bias)
        self.k_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=qkv_bias)
        self.v_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=qkv_bias)
        self.o_proj = Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=o_bias)
        if c.model_type == "qwen3":  # per-head RMSNorm before rotary
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Causal self-attention of ``x`` ``[B, T, H]`` after ``past`` (K/V ``[B, kv, P, D]``
        of the positions before); returns the output and the K/V of all ``P + T``."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim)
        k = self.k_proj(x).view(b, t, -1, self.head_dim)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        o, kv = self.attend(q, k, v, past)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1)), kv

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``N`` tokens ``x`` ``[N, H]`` at their own positions
        (``cos``/``sin`` ``[N, D]``): ``[N, heads, D]`` each, rotary applied (the same
        operations as :meth:`forward`, on a flat batch)."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, -1, self.head_dim)
        k = self.k_proj(x).view(n, -1, self.head_dim)
        v = self.v_proj(x).view(n, -1, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               past: tuple[torch.Tensor, torch.Tensor] | None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Causal attention of ``q`` ``[B, heads, T, D]`` over ``past`` then ``k``/``v``:
        the output ``[B, heads, T, D]`` and the K/V of all ``P + T`` positions."""
        t = q.shape[2]
        if past is not None and past[0].shape[2]:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        p = k.shape[2] - t
        if p == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, scale=self.scaling,
                                               enable_gqa=True)
        else:  # query i (position p + i) sees every key up to p + i
            keys = torch.arange(p + t, device=q.device)
            mask = keys[None, :] <= (p + torch.arange(t, device=q.device))[:, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                               enable_gqa=True)
        return o, (k, v)


class DecoderLayer(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c.hidden_size, c.intermediate_size, c.mlp_bias)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class NativeModel(nn.Module):
    """The decoder stack (transformers' ``*Model``: ``embed_tokens``, ``layers``, ``norm``)."""

    rollart_native = True

    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        self.config = c
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, c.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(c.head_dim, c.rope_theta)

    def forward_kv(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                   past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                   ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Final hidden states ``[B, T, H]`` of ``input_ids`` following ``past`` (per layer
        K/V of the positions before them; ``position_ids`` default to the next ones), and
        every layer's K/V including the new positions."""
        if position_ids is None:
            start = past[0][0].shape[2] if past else 0
            position_ids = torch.arange(start, start + input_ids.shape[1],
                                        device=input_ids.device).expand(input_ids.shape[0], -1)
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(h, position_ids)
        present = []
        for i, module in enumerate(self.layers):
            layer: DecoderLayer = module  # type: ignore[assignment]
            a, kv = layer.self_attn(layer.input_layernorm(h), cos, sin,
                                    past[i] if past else None)
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            present.append(kv)
        return self.norm(h), present

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                **_: Any) -> SimpleNamespace:
        return SimpleNamespace(last_hidden_state=self.forward_kv(input_ids, position_ids)[0])

    def forward_tree(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     groups: Sequence[TreeGroup], needed: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """Final hidden states ``[N, H]`` of a prefix tree's ``N`` tokens, given flat:
        ``groups`` in order, each ``rows`` pieces of ``length`` tokens (row-major) at
        positions ``start..start+length-1`` that follow the K/V of ``parents`` (rows of
        the concatenation, in group order, of the groups that end at ``start``; None at
        ``start`` 0). The trainer's shared-prefix forward
        (``rollart_trainer_torch.prefix_tree``).

        Layer by layer, not group by group: each projection and MLP runs once over all
        ``N`` tokens (one matrix product per weight, so backward computes each weight's
        gradient once, not once per group summed after), and only attention runs per
        group, against its parents' keys and values of the same layer. The same
        arithmetic as :meth:`forward_kv` per group, up to float rounding.

        ``needed``: the flat indices whose hidden states are wanted (a trainer reads one
        per trained token); the result is then ``[len(needed), H]`` in that order, and
        the last layer runs its output projection, MLP and the final norm on those rows
        only (its keys and values still cover every token: attention needs them). In a
        multi-turn batch the trained tokens are a few of the context's: for a small
        model that is a large share of the step."""
        h = self.embed_tokens(input_ids)  # one lookup: one dense embedding gradient
        cos, sin = self.rotary_emb(h, position_ids)
        sizes = [g.rows * g.length for g in groups]
        last = len(self.layers) - 1
        for index, module in enumerate(self.layers):
            layer: DecoderLayer = module  # type: ignore[assignment]
            attn: Attention = layer.self_attn
            q, k, v = attn.project(layer.input_layernorm(h), cos, sin)
            done: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # end -> K/V
            joined: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            outs = []
            for g, qg, kg, vg in zip(groups, q.split(sizes), k.split(sizes), v.split(sizes),
                                     strict=True):
                shape = (g.rows, g.length, -1, attn.head_dim)
                past = None
                if g.start > 0:
                    if g.start not in joined:  # every group ending there is done
                        parts = done.pop(g.start)
                        joined[g.start] = (torch.cat([kv[0] for kv in parts]),
                                           torch.cat([kv[1] for kv in parts]))
                    pk, pv = joined[g.start]
                    assert g.parents is not None
                    past = (pk.index_select(0, g.parents), pv.index_select(0, g.parents))
                o, kv = attn.attend(qg.view(shape).transpose(1, 2),
                                    kg.view(shape).transpose(1, 2),
                                    vg.view(shape).transpose(1, 2), past)
                outs.append(o.transpose(1, 2).reshape(g.rows * g.length, -1))
                done.setdefault(g.start + g.length, []).append(kv)
            o = torch.cat(outs)
            if needed is not None and index == last:  # only the rows that are read
                o, h = o.index_select(0, needed), h.index_select(0, needed)
            h = h + attn.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if needed is not None and not self.layers:
            h = h.index_select(0, needed)
        return self.norm(h)


class NativeCausalLM(nn.Module):
    """``model`` (the stack) and ``lm_head``: transformers' ``*ForCausalLM`` layout."""

    rollart_native = True
    source_path: str | None = None  # the folder it was loaded from (save_pretrained's side files)

    def __init__(self, c: SimpleNamespace, raw: dict[str, Any],
                 generation: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.config = c
        self.raw_config = raw
        self.generation_config = SimpleNamespace(**(generation or {}))
        if not hasattr(self.generation_config, "eos_token_id"):
            self.generation_config.eos_token_id = None
        self.model = NativeModel(c)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def base_model(self) -> NativeModel:
        return self.model

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                **_: Any) -> SimpleNamespace:
        """Logits ``[B, T, V]`` (right padding needs no mask under causal attention)."""
        hidden, _kv = self.model.forward_kv(input_ids, position_ids)
        return SimpleNamespace(logits=self.lm_head(hidden))

    def save_pretrained(self, out: str | Path) -> None:
        """``config.json``, ``generation_config.json`` and ``model.safetensors``: a folder
        transformers' ``AutoModelForCausalLM.from_pretrained`` loads."""
        from safetensors.torch import save_file

        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.raw_config, indent=2) + "\n")
        src = getattr(self, "source_path", None)
        for name in _SIDE_FILES:
            if src is not None and (Path(src) / name).is_file():
                shutil.copy2(Path(src) / name, path / name)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def _namespace(cfg: dict[str, Any]) -> SimpleNamespace:
    heads = int(cfg["num_attention_heads"])
    return SimpleNamespace(**{
        **cfg,
        "model_type": cfg["model_type"],
        "vocab_size": int(cfg["vocab_size"]),
        "hidden_size": int(cfg["hidden_size"]),
        "intermediate_size": int(cfg["intermediate_size"]),
        "num_hidden_layers": int(cfg["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_settings(cfg)[0],
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "pad_token_id": cfg.get("pad_token_id"),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 2048)),
    })


def load(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> NativeCausalLM | None:
    """The checkpoint at ``path`` as a :class:`NativeCausalLM` (eval mode, ``dtype``), or
    None when this module does not cover it (see :func:`unsupported_reason`) or its
    weights are not one ``model.safetensors`` file with exactly the expected tensors."""
    folder = Path(path)
    weights = folder / "model.safetensors"
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if unsupported_reason(raw) is not None or not weights.is_file():
        return None
    generation = None
    gen_file = folder / "generation_config.json"
    if gen_file.is_file():
        try:
            generation = json.loads(gen_file.read_text())
        except ValueError:
            generation = None
    from safetensors.torch import load_file

    c = _namespace(raw)
    model = NativeCausalLM(c, raw, generation)  # uninitialised: the checkpoint fills it
    tensors = load_file(str(weights))
    expected = set(model.state_dict())
    if c.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    if set(tensors) != expected:
        return None
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if any(tuple(t.shape) != shapes[k] for k, t in tensors.items()):
        return None
    model.load_state_dict({k: t.to(dtype) for k, t in tensors.items()}, strict=False,
                          assign=True)
    if c.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.source_path = str(folder)
    return model.eval()
