"""LoRA in trainer ``torch`` (``trainer.options.lora``), through peft.

- :func:`wrap`: peft's ``inject_adapter_in_model`` puts LoRA adapters on the model's
  linear layers named in ``target_modules``, in place: the model object (the SDK's native
  Llama or transformers' one, whichever ``model.implementation`` chose) keeps its forward,
  ``base_model`` and LM head, so the trainer's head-only and shared-prefix passes run
  unchanged; every base parameter is frozen, so AdamW gets only the adapters.
- :func:`export_tensors`: the weight update engines receive, the adapter only
  (:mod:`rollart_sdk.weights.lora`: ``<weight>.lora_A`` and ``<weight>.lora_B`` scaled).
- :func:`trainable_state` / :func:`load_trainable`: what a checkpoint keeps of the model
  (the adapters; the base is the model's checkpoint folder).
- :func:`save_adapter` / :func:`save_merged`: ``final_model/`` as a peft adapter folder
  (``PeftModel.from_pretrained`` loads it on the base model) and, on request, the merged
  model as a plain Hugging Face checkpoint.

peft is imported only here, when ``lora`` is set (``pip install rollart-trainer-torch[lora]``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rollart_sdk.weights.lora import adapter_names
from rollart_trainer_torch.options import LoraOptions

ADAPTER = "default"  # peft's adapter name
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_PEFT_PREFIX = "base_model.model."  # key prefix of a peft-saved adapter


def wrap(model: torch.nn.Module, opts: LoraOptions, base_path: str) -> Any:
    """Inject LoRA adapters into ``model`` (in place) and freeze everything else; returns
    peft's ``LoraConfig``. A ``target_modules`` entry that names no layer is an error."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as exc:
        raise ImportError(
            "trainer.options.lora needs peft: pip install 'rollart-trainer-torch[lora]' "
            "(or pip install peft)") from exc
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear)})
    unknown = [t for t in opts.target_modules if t not in linear]
    if unknown:
        raise ValueError(
            f"trainer.options.lora.target_modules: {unknown} name no linear layer of the "
            f"model at {base_path}; its linear layers are {linear}")
    # peft types lora_alpha int; a float scales by alpha / r all the same
    config = LoraConfig(r=opts.rank, lora_alpha=opts.alpha,  # type: ignore[arg-type]
                        lora_dropout=opts.dropout,
                        target_modules=list(opts.target_modules), bias="none",
                        base_model_name_or_path=base_path)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return config


def _layers(model: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    """``(name, layer)`` of every LoRA-wrapped linear layer."""
    from peft.tuners.lora import LoraLayer

    for name, m in model.named_modules():
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A:
            yield name, m


def export_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter as a weight-transport payload: per adapted layer ``L``,
    ``L.weight.lora_A`` and ``L.weight.lora_B`` (times alpha / rank), CPU copies in the
    model's dtype; the engine serves ``W0 + B @ A``."""
    for name, layer in _layers(model):
        a_name, b_name = adapter_names(f"{name}.weight")
        a = layer.lora_A[ADAPTER].weight.detach()
        b = layer.lora_B[ADAPTER].weight.detach() * layer.scaling[ADAPTER]
        dtype = layer.get_base_layer().weight.dtype
        yield a_name, a.to("cpu", dtype=dtype, copy=True)
        yield b_name, b.to("cpu", dtype=dtype, copy=True)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' parameters by their names in the wrapped model."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Copy a checkpoint's adapters into ``model``; names and shapes must match exactly."""
    own = dict(model.named_parameters())
    want = {n for n, p in own.items() if p.requires_grad}
    if set(tensors) != want:
        missing, extra = sorted(want - set(tensors)), sorted(set(tensors) - want)
        raise ValueError(
            f"{where}: the saved adapter does not fit this trainer's lora options: missing "
            f"{missing[:3]}, unexpected {extra[:3]} (same lora.rank and target_modules as "
            "the run that saved it?)")
    with torch.no_grad():
        for n, t in tensors.items():
            if tuple(t.shape) != tuple(own[n].shape):
                raise ValueError(f"{where}: {n} has shape {tuple(t.shape)}, this trainer's "
                                 f"adapter {tuple(own[n].shape)} (another lora.rank?)")
            own[n].copy_(t.to(own[n].device, own[n].dtype))


def save_adapter(model: torch.nn.Module, config: Any, out: Path) -> None:
    """A peft adapter folder: ``adapter_config.json`` and ``adapter_model.safetensors``
    (keys as ``PeftModel.save_pretrained`` writes them)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {_PEFT_PREFIX + n.replace(f".{ADAPTER}.", "."): t.cpu().contiguous()
             for n, t in trainable_state(model).items()}
    save_file(state, str(out / ADAPTER_FILE), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["target_modules"] = sorted(cfg.get("target_modules") or [])
    (out / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2, default=str) + "\n")


def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every adapter merged into its base weight
    (``W0 + scale * B @ A``, in float32, stored in the weight's dtype) and peft's names
    undone: the state dict of the unwrapped model."""
    from rollart_sdk.weights.lora import merge

    merged = {f"{name}.weight": merge(layer.get_base_layer().weight.detach(), a, b)
              for (name, layer), (_, a), (_, b) in _pairs(model)}
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            continue
        k = k.replace(".base_layer.", ".")
        out[k] = merged.get(k, v.detach())
    return out


def _pairs(model: torch.nn.Module) -> Iterator[tuple[tuple[str, Any], tuple[str, torch.Tensor],
                                                     tuple[str, torch.Tensor]]]:
    layers = dict(_layers(model))
    tensors = export_tensors(model)
    for a, b in zip(tensors, tensors, strict=False):
        name = a[0].removesuffix(".weight.lora_A")
        yield (name, layers[name]), a, b


def save_merged(model: torch.nn.Module, base_path: str, out: Path,
                side_files: tuple[str, ...]) -> None:
    """The merged model as a Hugging Face checkpoint folder (``config.json``, generation
    config and tokenizer files copied from ``base_path``; ``model.safetensors``)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    src = Path(base_path)
    for name in ("config.json", "generation_config.json", *side_files):
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    state = {k: v.cpu().contiguous() for k, v in merged_state(model).items()}
    config = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else {}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
