"""``check_trainer``: the conformance kit for trainer plugins.

Run it in a plugin's tests on a small Hugging Face causal LM::

    from rollart_sdk.testing.trainer import check_trainer

    def test_conformance(tmp_path):
        report = check_trainer(lambda: MyTrainer(model=ModelConfig(path=ckpt)), batch)

It checks, through the :class:`rollart_sdk.interfaces.Trainer` protocol only:

1. one ``train_step`` returns finite float metrics (``loss`` among them) and bumps
   ``version`` by one;
2. the step improves the batch's policy-gradient objective: re-evaluated with the new
   weights, ``-mean_tokens(A * log pi(token))`` is lower than before (the exact
   surrogate a trainer optimises varies; its first-order direction does not);
3. ``export_weights`` yields buckets of the new version, indexed 0..n-1, within the size
   bound, each verifying its checksum, and loading them into a fresh model reproduces
   the trainer's weights exactly (compared with ``save_pretrained``'s output);
4. ``save_checkpoint`` then a step, against a fresh trainer that ``load_checkpoint``s
   and takes the same step: identical version, metrics and weights.

Needs torch and transformers (imported when called). Returns a small report dict.
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollart_sdk.interfaces import Trainer
from rollart_sdk.types import TrainSample


def check_trainer(
    make_trainer: Callable[[], Trainer],
    batch: list[TrainSample],
    *,
    bucket_bytes: int = 16 * 1024,
    workdir: str | Path | None = None,
    resume_atol: float = 0.0,
) -> dict[str, Any]:
    """Check a trainer against the protocol on ``batch``; raise AssertionError on failure.

    ``make_trainer()`` must return a fresh trainer at the same starting weights each
    call. ``batch`` should hold non-zero advantages (or rewards that differ within a
    group) and behaviour log-probs from the starting model, as a rollout would.
    ``resume_atol`` is the tolerance on weights after resuming (0: bit-identical).
    """
    import torch

    from rollart_sdk.algorithms import fill_advantages
    from rollart_sdk.weights import verify

    with tempfile.TemporaryDirectory(prefix="rollart-check-trainer-") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)
        trainer = make_trainer()
        assert isinstance(trainer, Trainer), (
            f"{type(trainer).__name__} does not implement rollart_sdk.interfaces.Trainer "
            "(version, train_step, export_weights, save/load_checkpoint, save_pretrained)"
        )
        scored = fill_advantages(copy.deepcopy(batch))
        assert any(abs(s.advantage or 0.0) > 0 for s in scored), (
            "check_trainer needs a batch with a learning signal: non-zero advantages, or "
            "rewards that differ within a group"
        )

        # 1-2: one step lowers the policy-gradient loss on the same batch.
        v0 = trainer.version
        trainer.save_pretrained(str(root / "before"))
        before_model = _load(root / "before")
        loss_before = _pg_loss(before_model, scored)
        metrics = trainer.train_step(copy.deepcopy(batch))
        _check_metrics(metrics)
        assert trainer.version == v0 + 1, (
            f"train_step must bump version by 1: was {v0}, now {trainer.version}"
        )
        trainer.save_pretrained(str(root / "after"))
        after_model = _load(root / "after")
        loss_after = _pg_loss(after_model, scored)
        assert loss_after < loss_before, (
            f"one train_step did not lower the policy-gradient loss on the batch it "
            f"trained on: {loss_before:.6g} -> {loss_after:.6g} (sign error in the "
            f"advantage or loss? learning rate 0?)"
        )

        # 3: exported buckets round-trip into a fresh model.
        buckets = list(trainer.export_weights(bucket_bytes))
        assert buckets, "export_weights yielded no bucket"
        assert [b.index for b in buckets] == list(range(len(buckets))), (
            f"bucket indexes must be 0..n-1 in order, got {[b.index for b in buckets]}"
        )
        exported: dict[str, Any] = {}
        for b in buckets:
            assert b.version == trainer.version, (
                f"bucket {b.index} has version {b.version}, trainer is at {trainer.version}"
            )
            assert b.nbytes <= bucket_bytes or len(b.tensors) == 1, (
                f"bucket {b.index} holds {b.nbytes} bytes in {len(b.tensors)} tensors, "
                f"over the bound of {bucket_bytes}"
            )
            verify(b)
            dup = exported.keys() & b.tensors.keys()
            assert not dup, f"tensors exported twice: {sorted(dup)[:5]}"
            exported.update(b.tensors)
        fresh = _load(root / "before")
        result = fresh.load_state_dict(exported, strict=False)
        assert not result.unexpected_keys, f"exported unknown tensors {result.unexpected_keys[:5]}"
        want = after_model.state_dict()
        got = fresh.state_dict()
        # a tied embedding may go once (rollart_sdk.weights.without_aliases)
        missing = sorted(n for n in set(want) - set(exported)
                         if not _aliases(want, n) & exported.keys())
        assert not missing, f"tensors missing from the export: {missing[:5]}"
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), (
                f"exported weight {name!r} differs from the trainer's saved model"
            )

        # 4: checkpoint, step; resume in a fresh trainer, same step -> same result.
        ckpt = root / "ckpt"
        trainer.save_checkpoint(str(ckpt))
        m_a = trainer.train_step(copy.deepcopy(batch))
        w_a = _export(trainer)
        resumed = make_trainer()
        resumed.load_checkpoint(str(ckpt))
        assert resumed.version == v0 + 1, (
            f"load_checkpoint must restore version {v0 + 1}, got {resumed.version}"
        )
        m_b = resumed.train_step(copy.deepcopy(batch))
        w_b = _export(resumed)
        assert resumed.version == trainer.version
        assert set(w_a) == set(w_b)
        for name in w_a:
            assert torch.allclose(w_a[name], w_b[name], rtol=0.0, atol=resume_atol), (
                f"after resume, weight {name!r} differs from the uninterrupted run by "
                f"{(w_a[name] - w_b[name]).abs().max().item():.3g} (optimiser state or "
                "RNG not restored?)"
            )
        assert math.isclose(m_a["loss"], m_b["loss"], rel_tol=1e-6, abs_tol=1e-6 + resume_atol), (
            f"after resume, the step's loss {m_b['loss']} differs from {m_a['loss']}"
        )
        return {
            "loss_before": loss_before,
            "loss_after": loss_after,
            "metrics": metrics,
            "buckets": len(buckets),
            "exported_bytes": sum(b.nbytes for b in buckets),
        }


def _load(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _aliases(state: dict[str, Any], name: str) -> set[str]:
    """The other names of ``state`` that are the same tensor as ``name`` (tied weights)."""
    t = state[name]
    return {k for k, v in state.items()
            if k != name and v.data_ptr() == t.data_ptr() and v.shape == t.shape}


def _export(trainer: Trainer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in trainer.export_weights(1 << 30):
        out.update(b.tensors)
    return out


def _pg_loss(model: Any, batch: list[TrainSample]) -> float:
    """``-sum(A * log pi(token) * mask) / sum(mask)`` over the batch, one sequence at a time."""
    import torch

    from rollart_sdk.algorithms import token_logprobs

    total, tokens = 0.0, 0.0
    with torch.no_grad():
        for s in batch:
            ids = torch.tensor([s.input_ids])
            lp = token_logprobs(model(input_ids=ids).logits, ids)[0]
            mask = torch.tensor(s.loss_mask[1:], dtype=lp.dtype)
            total -= float(s.advantage or 0.0) * float((lp * mask).sum())
            tokens += float(mask.sum())
    return total / max(tokens, 1.0)


def _check_metrics(metrics: Any) -> None:
    assert isinstance(metrics, dict), f"train_step must return a dict, got {type(metrics)}"
    assert "loss" in metrics, f"train_step metrics need 'loss'; got {sorted(metrics)}"
    for k, v in metrics.items():
        assert isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool), (
            f"metric {k!r} must be a str -> float, got {type(v).__name__}"
        )
    assert math.isfinite(metrics["loss"]), f"loss is not finite: {metrics['loss']}"


def tiny_llama_checkpoint(path: str | Path, vocab: int = 64, hidden: int = 32, layers: int = 2,
                          heads: int = 4, kv_heads: int = 2, tie: bool = False,
                          seed: int = 0, intermediate: int | None = None) -> Path:
    """A random Llama saved as a Hugging Face checkpoint folder at ``path`` (for
    :func:`check_trainer` and trainer benchmarks; ``intermediate`` defaults to
    ``2 * hidden``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=tie, pad_token_id=0,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    return Path(path)


# Small checkpoints of each architecture the SDK's own forward and the torch engine's
# slot-cache forward cover: tests check both against transformers' model on every one.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "llama-gqa-tied": {"num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "mistral": {"model_type": "mistral", "sliding_window": None},
}


def tiny_arch_checkpoint(path: str | Path, name: str, **over: Any) -> Path:
    """A random two-layer model of architecture ``name`` (:data:`ARCHITECTURES`; ``over``
    changes config keys) saved as a Hugging Face checkpoint folder at ``path``, its norm
    weights away from 1 and its biases away from 0 so that every term of the forward
    counts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    base: dict[str, Any] = {
        "model_type": "llama", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 128, "pad_token_id": 0, "rope_theta": 5000.0,
        "rms_norm_eps": 1e-5, **ARCHITECTURES[name], **over}
    kind = base.pop("model_type")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **base))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    return Path(path)


def toy_batch(model_dir: str | Path, n_groups: int = 2, group_size: int = 4, seed: int = 0,
              version: int = 0, vocab: int = 64,
              lengths: tuple[tuple[int, int], ...] = ((3, 6), (2, 4), (1, 3), (1, 3)),
              ) -> list[TrainSample]:
    """Two-turn trajectories (prompt, action, observation, action) of varied lengths, the
    prompt shared within a group, with behaviour log-probs from a CPU float32 forward of
    the checkpoint (as an engine running it would report); reward = the share of even ids
    among the action tokens, so rewards differ within a group. Token ids are drawn below
    ``vocab``; ``lengths`` gives (min, max) for prompt, action, observation, action."""
    import torch

    from rollart_sdk.algorithms import token_logprobs

    model = _load(Path(model_dir))
    g = torch.Generator().manual_seed(seed)

    def toks(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return list(torch.randint(1, vocab, (n,), generator=g).tolist())

    batch = []
    for gi in range(n_groups):
        prompt = toks(*lengths[0])
        for _ in range(group_size):
            a1, obs, a2 = toks(*lengths[1]), toks(*lengths[2]), toks(*lengths[3])
            ids = prompt + a1 + obs + a2
            mask = [0] * len(prompt) + [1] * len(a1) + [0] * len(obs) + [1] * len(a2)
            with torch.no_grad():
                t = torch.tensor([ids])
                lps = [0.0, *token_logprobs(model(input_ids=t).logits, t)[0].tolist()]
            actions = a1 + a2
            batch.append(TrainSample(
                input_ids=ids, loss_mask=mask,
                behaviour_logprobs=[lp if m else 0.0 for lp, m in zip(lps, mask, strict=True)],
                token_versions=[version if m else -1 for m in mask],
                reward=sum(t % 2 == 0 for t in actions) / len(actions), group_id=f"g{gi}",
            ))
    return batch


def random_batch(n: int, vocab: int, seed: int = 0, prompt: tuple[int, int] = (20, 39),
                 action: tuple[int, int] = (4, 119)) -> list[TrainSample]:
    """``n`` one-turn trajectories of random ids with prompt and action lengths drawn from
    the inclusive ranges, groups of 8, reward 1 on every third, behaviour log-prob -3 on
    each action token: a fixed workload for timing trainers (no model needed)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(prompt[0], prompt[1] + 1, (1,), generator=g))
        a = int(torch.randint(action[0], action[1] + 1, (1,), generator=g))
        ids = list(torch.randint(1, vocab, (p + a,), generator=g).tolist())
        mask = [0] * p + [1] * a
        out.append(TrainSample(ids, mask, [-3.0 * m for m in mask], [0 if m else -1 for m in mask],
                               reward=float(i % 3 == 0), group_id=f"g{i // 8}"))
    return out
