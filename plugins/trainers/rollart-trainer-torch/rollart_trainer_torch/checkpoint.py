"""The torch trainer's checkpoint folder: what ``save_checkpoint`` writes and
``load_checkpoint`` reads back, so that the next step after a load is the step the saving
trainer would have taken.

Files (safetensors for tensors, JSON for the rest)::

    model.safetensors       the model's parameters (full fine-tuning), or
    adapter.safetensors     LoRA: the adapters only (the base is the model's own folder)
    optimizer.safetensors   AdamW's per-parameter tensors ("<param id>.<name>")
    rng.safetensors         torch's CPU (and CUDA) RNG states
    trainer_state.json      format, version, step, world size, AdamW's param groups and
                            scalars, Python's RNG state, the trainer options

The folder is written hidden beside its name, fsynced and renamed into place
(:func:`rollart_sdk.durable.new_dir`): a folder under the name is always complete.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from rollart_sdk import durable

FORMAT = 1
MODEL_FILE = "model.safetensors"
ADAPTER_FILE = "adapter.safetensors"
OPTIM_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
STATE_FILE = "trainer_state.json"
_EXTRA = "extra"  # optimizer.safetensors keys of top-level state_dict entries
_TENSOR = "__tensor__"


def write(out: Path, model: torch.nn.Module, optimizer: Any,
          meta: dict[str, Any], adapter: dict[str, torch.Tensor] | None = None) -> None:
    """Write ``model``, ``optimizer``, the RNG states and ``meta`` (version, step, ...)
    into the folder ``out``: built in a hidden folder beside it, fsynced, then renamed to
    ``out`` (:func:`rollart_sdk.durable.new_dir`), so ``out`` is never half-written: a
    crash or a full disk during the save leaves an earlier ``out`` as it was. With
    ``adapter`` (LoRA's trainable tensors) only those are saved, not the model.

    Generic over what the optimiser's ``state_dict()`` holds: every tensor of its
    per-parameter ``state`` goes to ``optimizer.safetensors`` (its device kind kept), every
    other value to the JSON state, and top-level entries beyond ``state`` and
    ``param_groups`` are kept the same way."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    on_cpu: list[str] = []

    def put(key: str, value: torch.Tensor) -> None:
        tensors[key] = value.detach().cpu().contiguous()
        if value.device.type == "cpu":
            on_cpu.append(key)

    scalars: dict[str, dict[str, Any]] = {}
    for pid, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                put(f"{pid}.{name}", value)
            else:
                scalars.setdefault(str(pid), {})[name] = value
    extra = {k: _split(v, f"{_EXTRA}.{k}", put) for k, v in sd.items()
             if k not in ("state", "param_groups")}
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"torch_cuda_{i}"] = s
    state = {
        "format": FORMAT,
        **meta,
        "param_groups": sd["param_groups"],
        "optimizer_scalars": scalars,
        "optimizer_extra": extra,
        "optimizer_on_cpu": on_cpu,
        "python_random": _jsonable(random.getstate()),
    }
    with durable.new_dir(out) as tmp:
        if adapter is not None:
            save_file({k: v.cpu().contiguous() for k, v in adapter.items()},
                      str(tmp / ADAPTER_FILE))
        else:
            save_model(model, str(tmp / MODEL_FILE))
        save_file(tensors, str(tmp / OPTIM_FILE))
        save_file(rng, str(tmp / RNG_FILE))
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))


def read(src: Path, model: torch.nn.Module, optimizer: Any, device: str,
         model_path: str, adapter: bool = False) -> dict[str, Any]:
    """Load what :func:`write` put in ``src`` into ``model`` and ``optimizer`` (on
    ``device``), restore the RNG states, and return the JSON state (``version``, ``step``,
    ...). ``model_path`` names the model in the error for a checkpoint that does not fit.
    ``adapter``: the model is LoRA-wrapped; the checkpoint must hold its adapters."""
    if not (src / STATE_FILE).is_file():
        raise FileNotFoundError(
            f"{src} is not a complete torch-trainer checkpoint ({STATE_FILE} missing): "
            "give the folder passed to save_checkpoint, or an earlier checkpoint if the "
            "save was interrupted"
        )
    state: dict[str, Any] = json.loads((src / STATE_FILE).read_text())
    if state.get("format") != FORMAT:
        raise ValueError(
            f"{src / STATE_FILE}: checkpoint format {state.get('format')!r} is not "
            f"supported (this trainer reads format {FORMAT})"
        )
    _read_model(src, model, device, model_path, adapter)
    flat = load_file(str(src / OPTIM_FILE), device=device)
    # Tensors saved from the CPU go back there (AdamW keeps 'step' on the CPU unless
    # capturable/fused); checkpoints from before the list existed: 'step' only.
    on_cpu = set(state.get("optimizer_on_cpu", ()))
    for key in flat:
        if key in on_cpu or ("optimizer_on_cpu" not in state and key.endswith(".step")):
            flat[key] = flat[key].cpu()
    opt_state: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        pid, name = key.split(".", 1)
        if pid == _EXTRA:
            continue
        opt_state.setdefault(int(pid), {})[name] = value
    for pid, values in state["optimizer_scalars"].items():
        opt_state.setdefault(int(pid), {}).update(values)
    extra = {k: _join(v, flat) for k, v in state.get("optimizer_extra", {}).items()}
    optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"],
                               **extra})
    _keep_saved_dtypes(optimizer, state["param_groups"], opt_state)
    rng = load_file(str(src / RNG_FILE))
    torch.set_rng_state(rng["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    random.setstate(_tuplify(state["python_random"]))
    return state


def _read_model(src: Path, model: torch.nn.Module, device: str, model_path: str,
                adapter: bool) -> None:
    """The model's part of a checkpoint: the full parameters, or LoRA's adapters."""
    from rollart_trainer_torch import lora

    has_adapter = (src / ADAPTER_FILE).is_file()
    if adapter != has_adapter:
        saved = "LoRA adapters" if has_adapter else "a full model"
        wanted = "LoRA adapters (trainer.options.lora is set)" if adapter else "a full model"
        raise ValueError(f"{src} holds {saved} but this trainer trains {wanted}: resume "
                         "with the trainer.options.lora of the run that saved it")
    if adapter:
        lora.load_trainable(model, load_file(str(src / ADAPTER_FILE), device=device),
                            str(src / ADAPTER_FILE))
        return
    missing, unexpected = load_model(model, str(src / MODEL_FILE), strict=False, device=device)
    if missing or unexpected:
        raise ValueError(
            f"{src / MODEL_FILE} does not match the model at {model_path}: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]} "
            "(was it saved from a different architecture?)"
        )


def _keep_saved_dtypes(optimizer: Any, groups: list[dict[str, Any]],
                       saved: dict[int, dict[str, Any]]) -> None:
    """torch's ``Optimizer.load_state_dict`` casts floating state to its parameter's dtype;
    state kept in another dtype on purpose (fp32 master weights and moments of bf16
    parameters) is put back as saved. An optimizer that sets ``manages_state_dtypes``
    (``rollart_sdk.backends.master_weights.MasterWeights``: its moments follow whether masters are
    on, whatever the checkpoint was saved with) is left as it loaded itself."""
    live = getattr(optimizer, "state", None)
    if live is None or getattr(optimizer, "manages_state_dtypes", False):
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [pid for g in groups for pid in g.get("params", [])]
    for pid, param in zip(ids, params, strict=False):
        for name, value in saved.get(int(pid), {}).items():
            current = live.get(param, {}).get(name)
            if (isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor)
                    and current.dtype != value.dtype):
                live[param][name] = value.to(current.device)


def _split(obj: Any, key: str, put: Any) -> Any:
    """``obj`` as JSON, each tensor inside replaced by ``{"__tensor__": its key}`` (the
    tensor handed to ``put(key, tensor)``)."""
    if isinstance(obj, torch.Tensor):
        put(key, obj)
        return {_TENSOR: key}
    if isinstance(obj, dict):
        return {str(k): _split(v, f"{key}.{k}", put) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_split(v, f"{key}.{i}", put) for i, v in enumerate(obj)]
    return obj


def _join(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of :func:`_split`."""
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            return tensors[obj[_TENSOR]]
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return [_jsonable(x) for x in obj]
    return obj


def _tuplify(obj: Any) -> Any:
    if isinstance(obj, list):
        return tuple(_tuplify(x) for x in obj)
    return obj
