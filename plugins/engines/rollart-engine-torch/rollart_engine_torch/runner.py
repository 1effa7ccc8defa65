"""The blocking half of the engine: a Llama-family forward pass over a slot KV cache.

Running sequences occupy slots ``0..B-1`` of one preallocated KV tensor per layer
(``[max_running, kv_heads, capacity, head_dim]``), so a decode step reads the cache as a
view (no gather) and every running sequence advances in ONE batched forward. Prefill runs
one sequence at a time (its matmuls are already large). When a sequence leaves, the last
slot moves into its place so slots stay dense.

The forward is written against the Hugging Face modules (projections, norms, MLP, rotary
embedding) rather than re-implementing them, so it computes what the model's own
``forward`` computes (the conformance kit checks logprobs to 1e-4); only the cache and
attention layout are ours.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one the slot-cache forward handles."""


class SlotRunner:
    """Model weights plus the slot KV cache; every method blocks (call via a thread)."""

    def __init__(self, model: Any, max_running: int, max_seq_len: int, device: str) -> None:
        cfg = model.config
        if cfg.model_type not in SUPPORTED or not hasattr(model, "model"):
            raise UnsupportedModelError(
                f"engine 'torch' supports model types {', '.join(SUPPORTED)}; this checkpoint "
                f"is {cfg.model_type!r}. Use another engine plugin (e.g. vllm) for it."
            )
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
            if cfg.model_type == "mistral":
                raise UnsupportedModelError(
                    "engine 'torch' does not implement sliding-window attention "
                    f"(config.sliding_window={cfg.sliding_window}); set it to null or use "
                    "another engine"
                )
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.layers = list(model.model.layers)
        self.embed = model.model.embed_tokens
        self.norm = model.model.norm
        self.lm_head = model.lm_head
        self.rotary = model.model.rotary_emb
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.kv_heads = int(cfg.num_key_value_heads or cfg.num_attention_heads)
        self.vocab_size = int(cfg.vocab_size)
        self.dtype = next(model.parameters()).dtype
        module = sys.modules[type(attn).__module__]
        self._rope: Callable[..., tuple[torch.Tensor, torch.Tensor]] = module.apply_rotary_pos_emb
        self.max_running = max_running
        self.max_seq_len = max_seq_len
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    # ------------------------------------------------------------------ memory

    def bytes_per_token(self) -> int:
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * self.dtype.itemsize

    def kv_bytes(self) -> int:
        return self.bytes_per_token() * self.max_running * self.capacity

    def kv_bytes_max(self) -> int:
        return self.bytes_per_token() * self.max_running * self.max_seq_len

    @torch.inference_mode()
    def ensure_capacity(self, n: int) -> None:
        """Grow every slot to hold ``n`` tokens (doubling, capped at ``max_seq_len``)."""
        if n <= self.capacity:
            return
        if n > self.max_seq_len:
            raise ValueError(f"sequence of {n} tokens exceeds max_seq_len={self.max_seq_len}")
        new = min(self.max_seq_len, max(n, 2 * self.capacity, 64))
        shape = (self.max_running, self.kv_heads, new, self.head_dim)
        for store in (self.k, self.v):
            grown = []
            for old in store or [None] * len(self.layers):
                t = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if old is not None:
                    t[:, :, : self.capacity] = old
                grown.append(t)
            store[:] = grown
        self.capacity = new

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached tokens of slot ``src`` into slot ``dst``."""
        if length <= 0 or src == dst:
            return
        for store in (self.k, self.v):
            for t in store:
                t[dst, :, :length] = t[src, :, :length]

    # ------------------------------------------------------------------ forward

    def _qkv(self, attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, -1, self.head_dim)
        k = attn.k_proj(x).view(b, t, -1, self.head_dim)
        v = attn.v_proj(x).view(b, t, -1, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    @torch.inference_mode()
    def prefill(self, slot: int, ids: Sequence[int]) -> torch.Tensor:
        """Run ``ids`` from position 0 into ``slot``; return fp32 CPU logits of the last token."""
        n = len(ids)
        self.ensure_capacity(n)
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        h = self.embed(x)
        pos = torch.arange(n, device=self.device)[None]
        cos, sin = self.rotary(h, pos)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(h))
            q, k = self._rope(q, k, cos, sin)
            self.k[i][slot, :, :n] = k[0]
            self.v[i][slot, :, :n] = v[0]
            o = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True
            )
            h = h + attn.o_proj(o.transpose(1, 2).reshape(1, n, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.norm(h[:, -1:]))[0, -1].float().cpu()

    @torch.inference_mode()
    def decode(self, last_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Feed one token per slot ``0..B-1`` at its position; return fp32 CPU logits ``[B, V]``."""
        b = len(last_ids)
        longest = max(positions) + 1
        self.ensure_capacity(longest)
        x = torch.tensor(list(last_ids), dtype=torch.long, device=self.device)[:, None]
        pos = torch.tensor(list(positions), dtype=torch.long, device=self.device)
        rows = torch.arange(b, device=self.device)
        h = self.embed(x)
        cos, sin = self.rotary(h, pos[:, None])
        # Row r attends to its own cached positions 0..pos[r] only.
        mask = (torch.arange(longest, device=self.device)[None, :] <= pos[:, None])[:, None, None]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(h))
            q, k = self._rope(q, k, cos, sin)
            self.k[i][rows, :, pos] = k[:, :, 0]
            self.v[i][rows, :, pos] = v[:, :, 0]
            o = F.scaled_dot_product_attention(
                q,
                self.k[i][:b, :, :longest],
                self.v[i][:b, :, :longest],
                attn_mask=mask,
                scale=attn.scaling,
                enable_gqa=True,
            )
            h = h + attn.o_proj(o.transpose(1, 2).reshape(b, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.norm(h))[:, 0].float().cpu()

    # ------------------------------------------------------------------ weights

    def check_tensors(self, tensors: dict[str, Any]) -> None:
        """Raise ValueError naming any tensor this model does not have or cannot take."""
        params = self.model.state_dict()
        for name, t in tensors.items():
            if name not in params:
                near = [p for p in params if p.split(".")[-1] == name.split(".")[-1]][:3]
                raise ValueError(
                    f"weight {name!r} is not a parameter of the served model "
                    f"({type(self.model).__name__}); similar names: {near or 'none'}. "
                    "Trainer and engine must use the same model architecture and names."
                )
            if tuple(t.shape) != tuple(params[name].shape):
                raise ValueError(
                    f"weight {name!r} has shape {tuple(t.shape)}, the served model expects "
                    f"{tuple(params[name].shape)}"
                )

    @torch.no_grad()
    def assign(self, tensors: dict[str, Any]) -> None:
        params = self.model.state_dict()
        for name, t in tensors.items():
            params[name].copy_(t.to(device=self.device, dtype=params[name].dtype))
