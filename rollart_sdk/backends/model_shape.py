"""The model's shape against a backend's parallelism, checked before any worker starts.

A backend's options model may define

- ``model_problems(self, config: Mapping[str, Any]) -> list[tuple[str | None, str]]``:
  given the model's Hugging Face config (``config.json`` as a dict: of ``model.path``, of
  the checkpoint a ``model.gguf`` converts to, or of ``model.tiny``), ``(option name,
  problem)`` for every setting the model cannot run with, e.g. a ``tensor_parallel_size``
  that does not divide the attention heads; option ``None`` for what the backend cannot
  run whatever its options (reported at the backend's ``name``).

``rollart validate`` and ``rollart train`` call it for the engine and the trainer
(``rollart_sdk/job/preflight.py::check_model_shape``) and report each problem at its
option (``trainer.options.tensor_parallel_size``) before Ray or any worker starts:
without it the backend finds out in its worker's constructor, after the run directory
was made, as a traceback from inside a Ray actor.

:func:`tensor_parallel_problems` is the rule that engines and trainers split attention
by; torch-free, so a config is checked without importing the backend's stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def attention_heads(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(query heads, key/value heads)`` of an HF config, or None when it says neither
    (a config whose shape the backend will read its own way)."""
    heads = config.get("num_attention_heads")
    if not isinstance(heads, int) or heads <= 0:
        return None
    kv = config.get("num_key_value_heads") or heads
    return heads, int(kv)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def tensor_parallel_problems(config: Mapping[str, Any], tp: int, option: str,
                             replicate_kv: bool) -> list[tuple[str, str]]:
    """The tensor-parallel size ``tp`` (option ``option``) against the model's heads.

    Every TP rank holds ``heads / tp`` query heads, so ``tp`` must divide them. The K/V
    heads are split the same way; an engine that replicates them when there are fewer
    K/V heads than ranks (``replicate_kv``: vLLM's and SGLang's ``QKVParallelLinear``)
    also takes a ``tp`` that is a multiple of them; Megatron's query groups are split
    only (``replicate_kv=False``), as is its MLP (``intermediate_size``).
    """
    shape = attention_heads(config)
    if tp <= 1 or shape is None:
        return []
    heads, kv = shape
    out: list[tuple[str, str]] = []
    if heads % tp:
        out.append((option, f"{option}={tp} does not divide the model's {heads} attention heads "
                    f"(each rank holds heads / {option}); choose one of {_divisors(heads)}"))
    elif kv % tp and not (replicate_kv and tp % kv == 0):
        fits = [d for d in range(2, heads + 1) if heads % d == 0
                and (kv % d == 0 or (replicate_kv and d % kv == 0))]
        rule = ("divide them or be a multiple of them" if replicate_kv else "divide them")
        out.append((option, f"{option}={tp} does not fit the model's {kv} key/value heads "
                    f"(it must {rule}); choose one of {', '.join(map(str, [1, *fits]))}"))
    if not replicate_kv:
        ffn = config.get("intermediate_size")
        if isinstance(ffn, int) and ffn % tp:
            out.append((option, f"{option}={tp} does not divide the model's intermediate_size "
                        f"{ffn} (each rank holds a slice of the MLP)"))
    return out


def rope_settings(config: Mapping[str, Any]) -> tuple[float, str, dict[str, Any]]:
    """``(base theta, rope type, its parameters)`` of an HF config in either layout:
    transformers 4 (``rope_theta`` and ``rope_scaling`` at the top) or transformers 5
    (``rope_parameters: {rope_theta, rope_type, ...}``, where ``rope_theta`` is no longer
    an attribute of the config object). Reading only one layout silently gives the
    default base 10,000 for every model saved by the other (SmolLM2's is 100,000,
    Qwen3's 1,000,000, Llama 3's 500,000): every position's rotation wrong."""
    merged: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        part = config.get(key)
        if isinstance(part, Mapping):
            merged.update(part)
    theta = merged.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
    kind = merged.get("rope_type", merged.get("type")) or "default"
    return float(theta), str(kind), merged


def context_problems(config: Mapping[str, Any], length: int | None,
                     option: str) -> list[tuple[str, str]]:
    """An engine's context length option (``option``, value ``length``; None: unset)
    beyond the model's ``max_position_embeddings``, which vLLM and SGLang refuse at
    start-up."""
    limit = config.get("max_position_embeddings")
    if length is None or not isinstance(limit, int) or length <= limit:
        return []
    return [(option, f"{option}={length} exceeds the model's context ({limit} tokens, "
             "max_position_embeddings); lower it or leave it unset")]


def architecture_problems(config: Mapping[str, Any], model_types: tuple[str, ...],
                          rope_types: tuple[str, ...] = ("default",)) -> list[str]:
    """What in a Llama-family HF config a plain Llama forward would compute differently
    (each a problem; none: it computes it exactly): a ``model_type`` outside
    ``model_types``, a rope type outside ``rope_types``, a partial rotary factor, an
    activation other than SiLU, attention dropout, ``pretraining_tp``, sliding-window
    attention (Mistral's, Qwen's ``use_sliding_window`` or ``layer_types``). The SDK's own
    forward (``rollart_sdk/nn/llama.py``) and trainer ``megatron`` both check it."""
    out = []
    kind = config.get("model_type")
    if kind not in model_types:
        out.append(f"model_type {kind!r} (supported: {', '.join(model_types)})")
    rope = rope_settings(config)[1]
    if rope not in rope_types:
        out.append(f"rope type {rope!r} (supported: {', '.join(rope_types)})")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        out.append("partial_rotary_factor")
    if config.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act {config.get('hidden_act')!r}")
    if float(config.get("attention_dropout", 0.0) or 0.0) != 0.0:
        out.append("attention_dropout")
    if config.get("pretraining_tp", 1) != 1:
        out.append("pretraining_tp")
    if config.get("sliding_window") and config.get("use_sliding_window", kind == "mistral"):
        out.append("sliding-window attention")
    layer_types = config.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        out.append("sliding-window layers")
    return out
