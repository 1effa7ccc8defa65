"""rollart_sdk.nn.llama: the SDK's own Llama-family forward against transformers'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollart_sdk.models import load_causal_lm
from rollart_sdk.nn import llama
from rollart_sdk.testing.trainer import ARCHITECTURES, tiny_arch_checkpoint

torch.set_num_threads(1)

ARCHS = ARCHITECTURES


def _checkpoint(tmp: Path, name: str, **over: object) -> Path:
    return tiny_arch_checkpoint(tmp / name, name, **over)


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


@pytest.mark.parametrize("name", list(ARCHS))
def test_forward_tree_matches_each_sequence_forward_and_its_gradients(tmp_path: Path,
                                                                      name: str) -> None:
    """The prefix tree's layer-by-layer forward (each weight once over every group's
    tokens, attention per group against its parents' K/V): three sequences sharing 5
    tokens, two of them 3 more, give the hidden states and the weight gradients of the
    three plain forwards."""
    from types import SimpleNamespace

    native = load_causal_lm(_checkpoint(tmp_path, name), implementation="native")
    assert isinstance(native, llama.NativeCausalLM)
    g = torch.Generator().manual_seed(2)
    root = torch.randint(1, 61, (5,), generator=g).tolist()
    mid = torch.randint(1, 61, (3,), generator=g).tolist()
    tails = [torch.randint(1, 61, (2,), generator=g).tolist() for _ in range(2)]
    other = torch.randint(1, 61, (4,), generator=g).tolist()
    seqs = [root + mid + tails[0], root + mid + tails[1], root + other]
    # Groups in the trainer's order, by (start, length): the root (1 x 5); the two 3-token
    # children of it (`mid`, `other`'s first 3 tokens); at start 8, `other`'s last token
    # (1 x 1, parent row 1: `other[:3]` in the rows of the groups ending at 8) and mid's
    # two tails (2 x 2, parent row 0: `mid`).
    groups = [SimpleNamespace(rows=1, length=5, start=0, parents=None, tokens=[root]),
              SimpleNamespace(rows=2, length=3, start=5, parents=torch.tensor([0, 0]),
                              tokens=[mid, other[:3]]),
              SimpleNamespace(rows=1, length=1, start=8, parents=torch.tensor([1]),
                              tokens=[other[3:]]),
              SimpleNamespace(rows=2, length=2, start=8, parents=torch.tensor([0, 0]),
                              tokens=tails)]
    ids = torch.tensor([t for grp in groups for row in grp.tokens for t in row])
    pos = torch.tensor([grp.start + i for grp in groups for _ in grp.tokens
                        for i in range(grp.length)])
    native.train()
    flat = native.model.forward_tree(ids, pos, groups)
    # Where each sequence's positions sit in the flat order (group after group, rows).
    at = {0: list(range(0, 5)) + [5, 6, 7] + [12, 13],
          1: list(range(0, 5)) + [5, 6, 7] + [14, 15],
          2: list(range(0, 5)) + [8, 9, 10] + [11]}
    weights = torch.randn(flat.shape[1], generator=g)
    (flat @ weights).square().sum().backward()
    tree_grads = {n: p.grad.clone() for n, p in native.named_parameters() if p.grad is not None}
    native.zero_grad()
    loss = 0.0
    for i, seq in enumerate(seqs):
        hidden, _ = native.model.forward_kv(torch.tensor([seq]))
        assert (hidden[0] - flat[at[i]]).abs().max() < 1e-5, i
        # each position counted once: the shared ones from the first sequence holding them
        own = [k for k, j in enumerate(at[i]) if all(j not in at[m] for m in range(i))]
        loss = loss + (hidden[0, own] @ weights).square().sum()
    loss.backward()
    assert tree_grads, "the tree forward produced no gradients"
    for n, p in native.named_parameters():
        if n.startswith("lm_head"):
            continue  # not on the hidden-state path
        assert p.grad is not None, n
        assert (tree_grads[n] - p.grad).abs().max() < 1e-4 * (1 + p.grad.abs().max()), n

    # Only some rows wanted (the trainer's: one per trained token, in its own order):
    # the last layer works on those only, and they and their gradients are the full
    # forward's rows (a row taken from the wrong place, or a missing layer, fails here).
    needed = torch.tensor([15, 3, 11, 7, 7])
    native.zero_grad()
    part = native.model.forward_tree(ids, pos, groups, needed)
    assert part.shape == (5, flat.shape[1])
    assert (part - flat.detach()[needed]).abs().max() < 1e-5
    (part @ weights).square().sum().backward()
    part_grads = {n: p.grad.clone() for n, p in native.named_parameters() if p.grad is not None}
    native.zero_grad()
    (native.model.forward_tree(ids, pos, groups)[needed] @ weights).square().sum().backward()
    for n, p in native.named_parameters():
        if p.grad is not None:
            assert (part_grads[n] - p.grad).abs().max() < 1e-5 * (1 + p.grad.abs().max()), n


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
