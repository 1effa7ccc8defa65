"""Checkpoints of trainer ``megatron``: Megatron's distributed checkpoint format for the
model and the AdamW state; an HF folder for ``save_pretrained``; reading HF weights.

Layout of a checkpoint folder ``path``::

    path/dist/          megatron.core.dist_checkpointing (torch_dist): model weights under
                        ``model.<param>``, AdamW moments under ``optimizer.exp_avg.<param>``
                        / ``optimizer.exp_avg_sq.<param>``, and with master weights (a
                        bfloat16 / float16 model) the fp32 masters under
                        ``optimizer.master.<param>``, each a ShardedTensor with the
                        parameter's TP sharding (DP replicas write once)
    path/trainer_state.json   version, step, AdamW step count and hyper-parameters, whether
                        masters were saved and the moments' dtype, the loss scale, RNG
                        state, options; written last by rank 0 (its presence marks a
                        complete checkpoint)

Every rank writes into a hidden folder beside ``path``; rank 0 fsyncs it and renames it
to ``path`` (:mod:`rollart_sdk.durable`): ``path`` is complete or absent, never torn, and
a failed save leaves an earlier ``path`` as it was.

Every rank calls save and load (the writes and reads are collective).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from rollart_sdk import durable

CHECKPOINT_FORMAT = 1
_STATE_FILE = "trainer_state.json"
_DIST_DIR = "dist"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def read_hf_weights(path: str) -> dict[str, torch.Tensor]:
    """All tensors of an HF checkpoint folder's ``*.safetensors`` files (sharded or not)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{path} has no *.safetensors weights; trainer megatron reads safetensors "
            "checkpoints (re-save the model with save_pretrained(safe_serialization=True))"
        )
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _moments(trainer: Any) -> dict[str, dict[str, torch.Tensor]]:
    """AdamW's ``exp_avg`` / ``exp_avg_sq`` per parameter name, whole local (TP) shards,
    and the fp32 ``master`` under master weights; gathered over the DP group under the
    distributed optimizer (collective then)."""
    opt = trainer.optimizer
    out: dict[str, dict[str, torch.Tensor]] = {}
    if trainer.options.use_distributed_optimizer:
        full = opt.full_moments()
        masters = opt.full_masters() if trainer.master_weights else None
        for i, name in enumerate(trainer.named_params):
            out[name] = {key: full[key][i] for key in full} if full is not None else {}
            if masters is not None:
                out[name]["master"] = masters[i]
        return {name: st for name, st in out.items() if st}
    for name, main in zip(trainer.named_params, opt.main_params, strict=True):
        st = opt.state.get(main, {})
        moments = {key: st[key] for key in ("exp_avg", "exp_avg_sq") if key in st}
        if trainer.master_weights:
            moments["master"] = main.detach()
        if moments:
            out[name] = moments
    return out


def _adam_steps(trainer: Any) -> dict[str, float]:
    opt = trainer.optimizer
    if trainer.options.use_distributed_optimizer:
        step = opt.adam_step
        return dict.fromkeys(trainer.named_params, step) if step else {}
    return {name: float(opt.state[main]["step"])
            for name, main in zip(trainer.named_params, opt.main_params, strict=True)
            if main in opt.state}


def _sharded_state(trainer: Any, moments: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
    from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor

    msd = trainer.model.sharded_state_dict(prefix="model.")
    model = {}
    for name in trainer.named_params:
        if f"model.{name}" not in msd:
            raise KeyError(f"Megatron's sharded state dict has no entry for {name!r}")
        model[name] = msd[f"model.{name}"]
    state: dict[str, Any] = {"model": model, "optimizer": {}}
    for name, st in moments.items():
        for key, tensor in st.items():
            state["optimizer"].setdefault(key, {})[name] = make_sharded_optimizer_tensor(
                model[name], tensor, f"optimizer.{key}"
            )
    return state


def save(trainer: Any, path: str) -> None:
    from megatron.core import dist_checkpointing

    out = Path(path)
    # Every rank writes into one hidden folder beside ``out`` (the same name on every
    # rank); rank 0 renames it to ``out`` once complete and fsynced, so ``out`` is never
    # half-written and an earlier ``out`` stays as it was until then.
    tmp = durable.partial_name(out)
    if trainer.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
        (tmp / _DIST_DIR).mkdir(parents=True)
    dist.barrier()
    # An error is raised after the last barrier: the other ranks wait there.
    failed: Exception | None = None
    try:
        dist_checkpointing.save(_sharded_state(trainer, _moments(trainer)),
                                str(tmp / _DIST_DIR))
    except Exception as exc:  # noqa: BLE001 - raised below, after the barriers
        failed = exc
    dist.barrier()
    if trainer.rank == 0:
        try:
            if failed is None:
                _write_state(trainer, tmp)
                durable.fsync_tree(tmp)
                durable.replace_dir(tmp, out)
        except Exception as exc:  # noqa: BLE001 - raised below, after the barrier
            failed = exc
        if failed is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    if failed is not None:
        raise failed


def _write_state(trainer: Any, out: Path) -> None:
    """``trainer_state.json`` into ``out`` (rank 0)."""
    groups = [{k: v for k, v in g.items() if k != "params"}
              for g in trainer.optimizer.param_groups]
    steps = _adam_steps(trainer)
    state = {
        "format": CHECKPOINT_FORMAT,
        "version": trainer.version,
        "step": trainer._step,
        "tensor_parallel_size": trainer.tp,
        "pipeline_parallel_size": trainer.pp,
        "world_size": trainer.world_size,
        "param_groups": groups,
        "adam_steps": steps,
        "master_weights": trainer.master_weights,
        "moments_dtype": "float32" if trainer.master_weights else _dtype(trainer),
        "loss_scale": trainer.optimizer.loss_scale,
        "loss_scale_good_steps": (trainer.optimizer.scaler.good_steps
                                  if trainer.optimizer.scaler is not None else 0),
        "python_random": _jsonable(random.getstate()),
        "torch_rng": torch.get_rng_state().tolist(),
        "options": trainer.options.model_dump(mode="json"),
    }
    (out / _STATE_FILE).write_text(json.dumps(state, indent=1))


def load(trainer: Any, path: str) -> None:
    from megatron.core import dist_checkpointing

    src = Path(path)
    if not (src / _STATE_FILE).is_file():
        raise FileNotFoundError(
            f"{src} is not a complete megatron-trainer checkpoint ({_STATE_FILE} missing): "
            "give the folder passed to save_checkpoint, or an earlier checkpoint if the "
            "save was interrupted"
        )
    state = json.loads((src / _STATE_FILE).read_text())
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{src / _STATE_FILE}: checkpoint format {state.get('format')!r} is "
                         f"not supported (this trainer reads format {CHECKPOINT_FORMAT})")
    saved = (state["tensor_parallel_size"], state.get("pipeline_parallel_size", 1))
    if saved != (trainer.tp, trainer.pp):
        raise ValueError(
            f"{src} was saved with tensor_parallel_size={saved[0]}, pipeline_parallel_size="
            f"{saved[1]}; this trainer has {trainer.tp}, {trainer.pp}: resume with the same "
            "TP and PP sizes (the data-parallel size may differ)"
        )
    # Every parameter takes every step (missing gradients are zero-filled), so one step
    # count stands for all; the names are rank 0's, which under PP are not this stage's.
    step = max(state["adam_steps"].values(), default=0.0)
    # Zero tensors of the right shapes and dtypes, so that the sharded template names
    # every moment (and master) saved: moments in the dtype they were saved in (before
    # master weights existed: the parameters'), masters in fp32.
    saved_masters = bool(state.get("master_weights", False))
    moments_dtype = getattr(torch, state["moments_dtype"]) if "moments_dtype" in state else None
    dtypes = {"exp_avg": moments_dtype, "exp_avg_sq": moments_dtype, "master": torch.float32}
    keys = [k for k, on in (("exp_avg", step), ("exp_avg_sq", step),
                            ("master", saved_masters)) if on]
    zeros = {name: {key: torch.zeros_like(p, dtype=dtypes[key] or p.dtype) for key in keys}
             for name, p in trainer.named_params.items() if keys}
    loaded = dist_checkpointing.load(_sharded_state(trainer, zeros), str(src / _DIST_DIR))
    moments = {name: {key: loaded["optimizer"][key][name] for key in st}
               for name, st in zeros.items()}
    masters = {name: st.pop("master") for name, st in moments.items() if "master" in st}
    moments = {name: st for name, st in moments.items() if st}
    with torch.no_grad():
        for name, p in trainer.named_params.items():
            p.copy_(loaded["model"][name])
    _restore_optimizer(trainer, moments, masters, step, state)
    for group, saved in zip(trainer.optimizer.param_groups, state["param_groups"], strict=True):
        for k, v in saved.items():
            if k != "params":
                group[k] = tuple(v) if isinstance(group.get(k), tuple) else v
    random.setstate(_tuplify(state["python_random"]))
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    trainer._version = int(state["version"])
    trainer._step = int(state["step"])
    dist.barrier()


def _restore_optimizer(trainer: Any, moments: dict[str, dict[str, torch.Tensor]],
                       masters: dict[str, torch.Tensor], step: float,
                       state: dict[str, Any]) -> None:
    """AdamW's moments and step, the fp32 masters (or, from a checkpoint without them, the
    loaded weights) and the loss scale, into the trainer's optimizer; after the model's
    parameters were loaded."""
    opt = trainer.optimizer
    if trainer.options.use_distributed_optimizer:
        opt.sync_master()
        if moments:
            names = list(trainer.named_params)
            opt.load_full_moments(
                {key: [moments[n][key] for n in names] for key in ("exp_avg", "exp_avg_sq")},
                step)
        if masters and trainer.master_weights:  # after the moments (they re-sync the range)
            opt.load_full_masters([masters[n] for n in trainer.named_params])
    else:
        with torch.no_grad():
            for name, p, main in zip(trainer.named_params, trainer.params, opt.main_params,
                                     strict=True):
                if name in moments:
                    opt.state[main] = {"step": torch.tensor(step),
                                       **{k: v.to(main.dtype) for k, v in moments[name].items()}}
                if trainer.master_weights:  # a checkpoint without masters: the loaded weights
                    main.copy_(masters.get(name, p))
                    # weights rounded stochastically were saved as drawn: kept as loaded
                    if not (opt.rounding == "stochastic" and p.dtype == torch.bfloat16):
                        p.copy_(main)
    if opt.scaler is not None and "loss_scale" in state:
        opt.scaler.scale = float(state["loss_scale"])
        opt.scaler.good_steps = int(state.get("loss_scale_good_steps", 0))


def save_pretrained(trainer: Any, path: str) -> None:
    """Gather the HF state dict (every rank takes part), rank 0 writes the folder."""
    tensors = dict(trainer.hf_tensors())  # a tied head is not among them: HF re-ties it
    if trainer.rank == 0:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        for f in Path(trainer.model_path).iterdir():
            skip = f.suffix in _WEIGHT_SUFFIXES or f.name.endswith(".index.json")
            if f.is_file() and not skip and not (out / f.name).exists():
                shutil.copy2(f, out / f.name)
    dist.barrier()  # readers on other ranks may open the folder right after


def _dtype(trainer: Any) -> str:
    return str(trainer.params[0].dtype).removeprefix("torch.")


def _jsonable(obj: Any) -> Any:
    return [_jsonable(x) for x in obj] if isinstance(obj, tuple) else obj


def _tuplify(obj: Any) -> Any:
    return tuple(_tuplify(x) for x in obj) if isinstance(obj, list) else obj
