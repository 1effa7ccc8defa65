"""The torch trainer's checkpoint folder: what ``save_checkpoint`` writes and
``load_checkpoint`` reads back, so that the next step after a load is the step the saving
trainer would have taken.

Files (safetensors for tensors, JSON for the rest)::

    model.safetensors       the model's parameters
    optimizer.safetensors   AdamW's per-parameter tensors ("<param id>.<name>")
    rng.safetensors         torch's CPU (and CUDA) RNG states
    trainer_state.json      format, version, step, world size, AdamW's param groups and
                            scalars, Python's RNG state, the trainer options; written
                            LAST: its presence marks a complete checkpoint
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

FORMAT = 1
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
STATE_FILE = "trainer_state.json"


def write(out: Path, model: torch.nn.Module, optimizer: Any,
          meta: dict[str, Any]) -> None:
    """Write ``model``, ``optimizer``, the RNG states and ``meta`` (version, step, ...)
    into the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / STATE_FILE).unlink(missing_ok=True)  # incomplete until rewritten below
    save_model(model, str(out / MODEL_FILE))
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[name] = value
    save_file(tensors, str(out / OPTIM_FILE))
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"torch_cuda_{i}"] = s
    save_file(rng, str(out / RNG_FILE))
    state = {
        "format": FORMAT,
        **meta,
        "param_groups": sd["param_groups"],
        "optimizer_scalars": scalars,
        "python_random": _jsonable(random.getstate()),
    }
    (out / STATE_FILE).write_text(json.dumps(state, indent=1))


def read(src: Path, model: torch.nn.Module, optimizer: Any, device: str,
         model_path: str) -> dict[str, Any]:
    """Load what :func:`write` put in ``src`` into ``model`` and ``optimizer`` (on
    ``device``), restore the RNG states, and return the JSON state (``version``, ``step``,
    ...). ``model_path`` names the model in the error for a checkpoint that does not fit."""
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
    missing, unexpected = load_model(model, str(src / MODEL_FILE), strict=False, device=device)
    if missing or unexpected:
        raise ValueError(
            f"{src / MODEL_FILE} does not match the model at {model_path}: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]} "
            "(was it saved from a different architecture?)"
        )
    flat = load_file(str(src / OPTIM_FILE), device=device)
    opt_state: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        pid, name = key.split(".", 1)
        # AdamW keeps 'step' on the CPU unless capturable/fused.
        opt_state.setdefault(int(pid), {})[name] = value.cpu() if name == "step" else value
    for pid, values in state["optimizer_scalars"].items():
        opt_state.setdefault(int(pid), {}).update(values)
    optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"]})
    rng = load_file(str(src / RNG_FILE))
    torch.set_rng_state(rng["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    random.setstate(_tuplify(state["python_random"]))
    return state


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return [_jsonable(x) for x in obj]
    return obj


def _tuplify(obj: Any) -> Any:
    if isinstance(obj, list):
        return tuple(_tuplify(x) for x in obj)
    return obj
