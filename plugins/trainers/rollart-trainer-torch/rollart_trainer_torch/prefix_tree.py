"""Shared-prefix forward: each distinct token prefix of a batch computed once.

GRPO batches are full of shared prefixes: a group's trajectories start from one prompt,
and in a multi-turn task they share every turn up to the first action where they differ
(FrozenLake's 64 episodes of a step share the first observation; two that chose the same
first moves share those turns too). A padded forward computes every one of those tokens
once per trajectory. Here the batch becomes a tree:

1. each sequence is cut to the positions the loss needs (a position ``p`` is an input
   when some token ``q > p`` is trained; tokens after the last trained one are never an
   input);
2. *cuts*: the offsets where two sequences of the batch first differ, or where one ends
   inside a longer one (from the longest common prefixes of neighbours in lexicographic
   order); every sequence is split at every cut, so a piece ``[start, end)`` of one sequence is a node of the tree, the same
   node for every sequence with the same tokens up to ``end``;
3. nodes with the same ``(start, length)`` form a group, positions ``start..end-1``,
   attending to its parents' keys and values (gathered rows of the groups ending at
   ``start``, autograd flows through them). With the SDK's own Llama forward
   (``rollart_sdk.nn.llama``) the model runs layer by layer over every group's tokens at
   once (``NativeModel.forward_tree``: one product per weight, so each weight's gradient
   is computed once; only attention runs per group); with transformers' model, one
   forward per group with its parents as the cache;
4. a trained token ``t`` of sequence ``i`` takes its log-prob from the hidden state of
   the node holding position ``t - 1`` on ``i``'s path.

Attention sees exactly what a causal forward over each whole sequence sees (its own
prefix), so log-probs, loss and gradients equal the padded forward's up to float
rounding (tests: ``test_prefix_tree_matches_the_padded_forward``). Works for models whose
decoder takes ``cache`` and ``position_ids`` (the Llama family: ``HEAD_ONLY_MODELS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from rollart_sdk.types import TrainSample

_Node = tuple[tuple[int, int], int]  # (group key (start, length), row in the group)


@dataclass
class _Group:
    start: int
    length: int
    tokens: list[list[int]] = field(default_factory=list)  # one row per node
    parents: list[int] = field(default_factory=list)  # row in the KV ending at ``start``
    flat: int = 0  # offset of this group's first hidden state in the flat list


@dataclass
class PrefixTree:
    """The batch as groups of nodes, and where each trained token reads its hidden state."""

    groups: list[_Group]
    rows: list[int]  # per trained token (sample-major): flat hidden-state index of t - 1
    sample_pos: list[tuple[int, int]]  # per trained token: (sample, t - 1)
    computed: int  # tokens run through the model
    padded: int  # tokens a right-padded forward of the same sequences would run

    @classmethod
    def build(cls, batch: list[TrainSample]) -> PrefixTree:
        seqs: list[list[int]] = []
        sample_pos: list[tuple[int, int]] = []
        for i, s in enumerate(batch):
            trained = [t for t in range(1, len(s.input_ids)) if s.loss_mask[t]]
            seqs.append(list(s.input_ids[: trained[-1]]) if trained else [])
            sample_pos.extend((i, t - 1) for t in trained)
        cuts = _cut_offsets(seqs)
        groups: dict[tuple[int, int], _Group] = {}
        node_of: dict[tuple[_Node | None, tuple[int, ...]], _Node] = {}
        parent_of: dict[tuple[int, int], list[_Node | None]] = {}
        paths: list[list[tuple[int, _Node]]] = []  # per sample: (start, node) of its pieces
        for seq in seqs:
            path: list[tuple[int, _Node]] = []
            if not seq:  # nothing trained: no input position is needed
                paths.append(path)
                continue
            bounds = [0, *(c for c in cuts if 0 < c < len(seq)), len(seq)]
            parent: _Node | None = None
            for a, b in zip(bounds, bounds[1:], strict=False):
                key = (parent, tuple(seq[a:b]))
                node = node_of.get(key)
                if node is None:
                    gkey = (a, b - a)
                    g = groups.setdefault(gkey, _Group(a, b - a))
                    g.tokens.append(seq[a:b])
                    parent_of.setdefault(gkey, []).append(parent)
                    node = node_of[key] = (gkey, len(g.tokens) - 1)
                path.append((a, node))
                parent = node
            paths.append(path)
        ordered = sorted(groups.values(), key=lambda g: (g.start, g.length))
        # A child's parent row: its position in the concatenation, in group order, of the
        # groups ending at the child's start (hidden() concatenates their keys so).
        base: dict[tuple[int, int], int] = {}
        filled: dict[int, int] = {}
        for g in ordered:
            end = g.start + g.length
            base[(g.start, g.length)] = filled.get(end, 0)
            filled[end] = filled.get(end, 0) + len(g.tokens)
        flat = 0
        for g in ordered:
            g.parents = [-1 if p is None else base[p[0]] + p[1]
                         for p in parent_of[(g.start, g.length)]]
            g.flat = flat
            flat += len(g.tokens) * g.length
        rows = []
        for i, pos in sample_pos:
            for a, (gkey, row) in reversed(paths[i]):
                if a <= pos:
                    g = groups[gkey]
                    rows.append(g.flat + row * g.length + (pos - a))
                    break
        padded = len(seqs) * max((len(s) for s in seqs), default=0)
        return cls(ordered, rows, sample_pos, flat, padded)

    def hidden(self, base_model: Any, needed: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states of every computed position, flat ``[computed, H]``; with
        ``needed`` (flat indices, e.g. :attr:`rows`), those rows only, in that order (the
        SDK's own model then skips the last layer's work on the others)."""
        native = getattr(base_model, "rollart_native", False)  # rollart_sdk.nn.llama
        device = next(base_model.parameters()).device
        if native:  # layer by layer over every group at once (NativeModel.forward_tree)
            ids = torch.tensor([t for g in self.groups for row in g.tokens for t in row],
                               dtype=torch.long, device=device)
            pos = torch.tensor([g.start + i for g in self.groups for _ in g.tokens
                                for i in range(g.length)], dtype=torch.long, device=device)
            spec = [SimpleNamespace(rows=len(g.tokens), length=g.length, start=g.start,
                                    parents=(torch.tensor(g.parents, dtype=torch.long,
                                                          device=device)
                                             if g.start > 0 else None))
                    for g in self.groups]
            return base_model.forward_tree(ids, pos, spec, needed)
        from transformers import DynamicCache
        kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # end -> per layer
        parts_by_end: dict[int, list[list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        out: list[torch.Tensor] = []
        for g in self.groups:
            ids = torch.tensor(g.tokens, dtype=torch.long, device=device)
            n = ids.shape[0]
            past: list[tuple[torch.Tensor, torch.Tensor]] = []
            if g.start > 0:
                if g.start not in kv:  # every group ending here is done (sorted by start)
                    kv[g.start] = [
                        (torch.cat([p[layer][0] for p in parts_by_end[g.start]]),
                         torch.cat([p[layer][1] for p in parts_by_end[g.start]]))
                        for layer in range(len(parts_by_end[g.start][0]))
                    ]
                    del parts_by_end[g.start]
                idx = torch.tensor(g.parents, dtype=torch.long, device=device)
                past = [(k.index_select(0, idx), v.index_select(0, idx))
                        for k, v in kv[g.start]]
            pos = torch.arange(g.start, g.start + g.length, device=device).expand(n, -1)
            cache = DynamicCache(config=base_model.config)
            for layer, (k, v) in enumerate(past):
                cache.update(k, v, layer)
            res = base_model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True)
            hidden = res.last_hidden_state
            kept: list[Any] = list(cache.layers)  # full-attention layers: keys and values
            layers = [(layer.keys, layer.values) for layer in kept]
            out.append(hidden.reshape(n * g.length, -1))
            parts_by_end.setdefault(g.start + g.length, []).append(layers)
        flat = torch.cat(out)
        return flat if needed is None else flat.index_select(0, needed)


def tree_micro_batches(batch: list[TrainSample], max_seqs: int, max_tokens: int,
                       max_ratio: float) -> list[list[TrainSample]] | None:
    """Samples in lexicographic order (those sharing a prefix are neighbours), cut at
    ``max_seqs`` sequences or ``max_tokens`` distinct prefix tokens (what a tree
    computes); None when the distinct tokens exceed ``max_ratio`` of the batch's tokens
    (little to share: the padded forward is cheaper)."""
    order = sorted(batch, key=lambda s: s.input_ids)
    new = [len(s.input_ids) - _lcp(a.input_ids if a else None, s.input_ids)
           for a, s in zip([None, *order], order, strict=False)]
    if sum(new) > max_ratio * sum(len(s.input_ids) for s in batch):
        return None
    trees: list[list[TrainSample]] = []
    cur: list[TrainSample] = []
    size = 0
    for s, n in zip(order, new, strict=True):
        if cur and (len(cur) >= max_seqs or size + n > max_tokens):
            trees.append(cur)
            cur, size = [], len(s.input_ids)
        else:
            size += n
        cur.append(s)
    if cur:
        trees.append(cur)
    return trees


def _lcp(a: list[int] | None, b: list[int]) -> int:
    """Length of the common prefix of ``a`` and ``b`` (0 when ``a`` is None)."""
    if a is None:
        return 0
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _cut_offsets(seqs: list[list[int]]) -> list[int]:
    """Offsets where two sequences first differ, or where one ends and a longer one with
    the same tokens goes on (so that the shorter one's last piece is the longer one's),
    sorted."""
    order = sorted(seqs)
    cuts: set[int] = set()
    for a, b in zip(order, order[1:], strict=False):  # a <= b: a may be a prefix of b
        n = min(len(a), len(b))
        k = 0
        while k < n and a[k] == b[k]:
            k += 1
        if k < len(b):
            cuts.add(k)
    return sorted(cuts)
