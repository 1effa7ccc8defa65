"""The blocking half of the engine: a Llama-family forward pass over a slot KV cache.

Every sequence the engine knows about (running, or a finished turn kept for its
trajectory's next turn) owns one slot of a preallocated KV tensor per layer
(``[num_slots, kv_heads, capacity, head_dim]``). One engine step is ONE batched forward
(:meth:`SlotRunner.extend`): each row feeds the tokens of its sequence that are not cached
yet (a whole prompt, the new observation of a multi-turn trajectory, or the single last
token when decoding), writes their K/V into its slot at their positions and attends to
its slot's cached prefix. Prefill and decode are the same call.

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

from rollart_engine_torch.adapters import AdapterMerger

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one the slot-cache forward handles."""


class SlotRunner:
    """Model weights plus the slot KV cache; every method blocks (call via a thread)."""

    def __init__(self, model: Any, num_slots: int, max_seq_len: int, device: str) -> None:
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
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.adapters = AdapterMerger()  # LoRA payloads: base weights kept to re-merge

    # ------------------------------------------------------------------ memory

    def bytes_per_token(self) -> int:
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * self.dtype.itemsize

    def kv_bytes(self) -> int:
        return self.bytes_per_token() * self.num_slots * self.capacity

    def kv_bytes_max(self) -> int:
        return self.bytes_per_token() * self.num_slots * self.max_seq_len

    @torch.inference_mode()
    def ensure_capacity(self, n: int) -> None:
        """Grow every slot to hold ``n`` tokens (doubling, capped at ``max_seq_len``)."""
        if n <= self.capacity:
            return
        if n > self.max_seq_len:
            raise ValueError(f"sequence of {n} tokens exceeds max_seq_len={self.max_seq_len}")
        new = min(self.max_seq_len, max(n, 2 * self.capacity, 64))
        shape = (self.num_slots, self.kv_heads, new, self.head_dim)
        for store in (self.k, self.v):
            grown = []
            olds: list[torch.Tensor | None] = [*store] if store else [None] * len(self.layers)
            for old in olds:
                t = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if old is not None:
                    t[:, :, : self.capacity] = old
                grown.append(t)
            store[:] = grown
        self.capacity = new

    @torch.inference_mode()
    def export_slot(self, slot: int, n: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """CPU copies of cached positions ``start..n-1`` of ``slot``: ``[layers, kv_heads,
        n - start, head_dim]`` for K and for V (a KV hand-off to another engine)."""
        if n <= start or not self.k:
            empty = torch.zeros((len(self.layers), self.kv_heads, 0, self.head_dim), dtype=self.dtype)
            return empty, empty.clone()
        k = torch.stack([t[slot, :, start:n] for t in self.k]).to("cpu", copy=True)
        v = torch.stack([t[slot, :, start:n] for t in self.v]).to("cpu", copy=True)
        return k, v

    @torch.inference_mode()
    def import_slot(self, slot: int, k: torch.Tensor, v: torch.Tensor, at: int = 0) -> None:
        """Write K/V from :meth:`export_slot` (``n`` positions) into positions
        ``at..at+n-1`` of ``slot``."""
        expect = (len(self.layers), self.kv_heads, self.head_dim)
        got = (k.shape[0], k.shape[1], k.shape[3]) if k.dim() == 4 else None
        if got != expect or k.shape != v.shape:
            raise ValueError(
                f"KV hand-off of shape {tuple(k.shape)} does not fit this model's cache "
                f"(layers, kv_heads, n, head_dim) = {expect[0]}, {expect[1]}, n, {expect[2]}"
            )
        n = int(k.shape[2])
        if n == 0:
            return
        self.ensure_capacity(at + n)
        for i in range(len(self.layers)):
            self.k[i][slot, :, at : at + n] = k[i].to(self.device, self.dtype)
            self.v[i][slot, :, at : at + n] = v[i].to(self.device, self.dtype)

    @torch.inference_mode()
    def copy_slot(self, src: int, dst: int, start: int, end: int) -> None:
        """Copy cached positions ``start..end-1`` of slot ``src`` into slot ``dst`` (a row
        identical to one computed in the same step)."""
        if end <= start:
            return
        self.ensure_capacity(end)
        for store in (self.k, self.v):
            for t in store:
                t[dst, :, start:end] = t[src, :, start:end]

    # ------------------------------------------------------------------ forward

    def _qkv(self, attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Queries, keys and values of the flat tokens ``x`` ``[N, H]``: ``[N, heads, D]``."""
        n = x.shape[0]
        q = attn.q_proj(x).view(n, -1, self.head_dim)
        k = attn.k_proj(x).view(n, -1, self.head_dim)
        v = attn.v_proj(x).view(n, -1, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    @torch.inference_mode()
    def extend(self, slots: Sequence[int], chunks: Sequence[Sequence[int]],
               starts: Sequence[int], logits: bool = True) -> torch.Tensor | None:
        """One batched forward: row ``r`` feeds ``chunks[r]`` at positions ``starts[r]...``
        into slot ``slots[r]`` (whose positions ``0..starts[r]-1`` are already cached).

        The rows' tokens go flat (no padding): every projection and MLP is one product
        over all of them, and each layer writes every new key and value into the cache
        with one indexed copy. Attention: the one-token rows (decodes) in one call over
        their gathered slots; each longer row (a prompt, a new observation) straight on
        its own slot of the cache (no copy). The last layer runs its output projection
        and MLP on each row's last token only: nothing reads the others'.

        Returns fp32 CPU logits ``[B, V]`` of each row's LAST fed token (None when
        ``logits`` is False: a prefill-only hand-off)."""
        b = len(slots)
        lens = [len(c) for c in chunks]
        if b == 0 or min(lens) < 1:
            raise ValueError("extend needs at least one row, each with at least one token")
        self.ensure_capacity(max(s + n for s, n in zip(starts, lens, strict=True)))
        dev = self.device
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=dev)
        pos = torch.tensor([s + i for s, n in zip(starts, lens, strict=True) for i in range(n)],
                           dtype=torch.long, device=dev)
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        lasts = torch.tensor(offsets[1:], dtype=torch.long, device=dev) - 1
        # Where each token's K/V go: (slot, position).
        token_slot = torch.tensor([s for s, n in zip(slots, lens, strict=True) for _ in range(n)],
                                  dtype=torch.long, device=dev)
        one = [r for r in range(b) if lens[r] == 1]  # decodes: batched attention
        many = [r for r in range(b) if lens[r] > 1]  # prompts/observations: per row
        decode = _Decodes.of(one, slots, starts, offsets, dev) if one else None
        h = self.embed(ids)  # [N, H]
        cos, sin = (t[0] for t in self.rotary(h, pos[None]))  # [N, D]
        last_layer = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(h))
            q, k = self._rope(q, k, cos, sin)  # [N, heads, D]; cos/sin [N, 1, D]
            kc, vc = self.k[i], self.v[i]
            kc[token_slot, :, pos] = k
            vc[token_slot, :, pos] = v
            only_last = i == last_layer
            out = q.new_empty((b if only_last else q.shape[0], q.shape[1] * q.shape[2]))
            if decode is not None:
                o = F.scaled_dot_product_attention(
                    q.index_select(0, decode.tokens)[:, :, None],
                    kc[:, :, : decode.end].index_select(0, decode.slots),
                    vc[:, :, : decode.end].index_select(0, decode.slots),
                    attn_mask=decode.mask, scale=attn.scaling, enable_gqa=True)
                out.index_copy_(0, decode.rows if only_last else decode.tokens,
                                o.reshape(o.shape[0], -1))
            for r in many:
                slot, a, n = slots[r], offsets[r], lens[r]
                end = starts[r] + n
                m = 1 if only_last else n
                mask = None
                if m > 1:  # query j (position end - m + j) sees the keys up to it
                    keys = torch.arange(end, device=dev)
                    mask = keys[None, :] <= torch.arange(end - m, end, device=dev)[:, None]
                o = F.scaled_dot_product_attention(
                    q[a + n - m : a + n].transpose(0, 1)[None], kc[slot : slot + 1, :, :end],
                    vc[slot : slot + 1, :, :end], attn_mask=mask, scale=attn.scaling,
                    enable_gqa=True)
                (out[r : r + 1] if only_last else out[a : a + n]).copy_(
                    o[0].transpose(0, 1).reshape(m, -1))
            if only_last:
                h = h.index_select(0, lasts)
            h = h + attn.o_proj(out)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if not logits:
            return None
        if not self.layers:
            h = h.index_select(0, lasts)
        return self.lm_head(self.norm(h)).float().cpu()

    # ------------------------------------------------------------------ weights

    def check_tensors(self, tensors: dict[str, Any]) -> None:
        """Raise ValueError naming any tensor this model does not have or cannot take
        (LoRA adapter pairs: :mod:`rollart_engine_torch.adapters`)."""
        self.adapters.check(tensors, self.model.state_dict(), self._check_full)

    def _check_full(self, tensors: dict[str, Any]) -> None:
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
        self.adapters.assign(tensors, self.model.state_dict())


class _Decodes:
    """The one-token rows of a step, for their one batched attention call: their rows,
    their tokens' flat indices, their slots, the longest context and (when the contexts
    differ in length) the key mask ``[rows, 1, 1, end]``."""

    __slots__ = ("end", "mask", "rows", "slots", "tokens")

    def __init__(self, rows: torch.Tensor, tokens: torch.Tensor, slots: torch.Tensor,
                 end: int, mask: torch.Tensor | None) -> None:
        self.rows, self.tokens, self.slots, self.end, self.mask = rows, tokens, slots, end, mask

    @classmethod
    def of(cls, one: list[int], slots: Sequence[int], starts: Sequence[int],
           offsets: list[int], dev: torch.device) -> _Decodes:
        ends = [starts[r] + 1 for r in one]
        end = max(ends)
        mask = None
        if min(ends) < end:  # a row sees the keys of its own context only
            mask = (torch.arange(end, device=dev)[None, :]
                    < torch.tensor(ends, device=dev)[:, None])[:, None, None]
        return cls(torch.tensor(one, dtype=torch.long, device=dev),
                   torch.tensor([offsets[r] for r in one], dtype=torch.long, device=dev),
                   torch.tensor([slots[r] for r in one], dtype=torch.long, device=dev),
                   end, mask)
