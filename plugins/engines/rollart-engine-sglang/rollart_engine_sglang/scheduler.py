"""Runs inside SGLang's scheduler process: the collective path's staging and commit.

SGLang 0.5.23 runs the model in a scheduler process of its own (spawned: a patch made in
the engine worker's process does not reach it). Two documented SGLang mechanisms bring
this module there:

- its general plugins: the entry point ``rollart`` in group ``sglang.srt.plugins`` (this
  package's ``pyproject.toml``) is loaded by ``load_plugins()`` at the start of
  ``run_scheduler_process`` (``sglang/srt/managers/scheduler.py``); :func:`register`
  hooks ``Scheduler.handle_rpc_request`` (``HookType.AROUND``) so that an RPC whose
  method starts with ``rollart_`` runs :func:`handle` here and answers its JSON result
  in ``RpcReqOutput.message`` (SGLang's own RPCs pass through unchanged);
- its custom weight loaders: the adapter starts SGLang with ``custom_weight_loader=
  [LOADER]``, and ``update_weights_from_tensor(load_format=LOADER)`` calls
  :func:`load_staged` with the model, inside SGLang's weight-update session.

The protocol (the same as vLLM's worker extension, ``rollart_sdk.weights.direct``):

1. ``rollart_stage(manifest, spec)``: a :class:`~rollart_sdk.weights.direct.WorkerStaging`
   (the transport's receiver, built from ``spec``) receives the version in a background
   thread of this process, verifying every bucket's checksum; generation goes on;
2. ``rollart_status()``: that transfer's status;
3. ``rollart_check(version, checkpoint)``: the staged buckets taken out of staging and
   checked by name and shape against the served checkpoint (raises before anything is
   touched); held for the commit;
4. the commit: ``load_staged`` loads every checked tensor in one ``model.load_weights``
   call; ``rollart_result(version)`` then says whether it did;
5. ``rollart_cancel(version)``: drop the staged or checked version (a failed or
   superseded round); the served weights are untouched.

A handler that raises answers ``success=False`` with the error (SGLang's RPC handler
catches it); ``load_staged`` never raises (an exception there would end the scheduler):
it records what happened for ``rollart_result``.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

LOADER = "rollart_engine_sglang.scheduler.load_staged"
PREFIX = "rollart_"
MARKER = "rollart.staged_version"  # the one tensor update_weights_from_tensor carries
RPC_TARGET = "sglang.srt.managers.scheduler.Scheduler.handle_rpc_request"

_state: dict[str, Any] = {
    "staging": None,   # WorkerStaging
    "ready": None,     # (version, [[(name, tensor), ...] per bucket]) after rollart_check
    "result": None,    # {"version", "error", "tensors"} of the last load_staged
    "shapes": {},      # checkpoint path -> checkpoint_shapes(path)
}


def register() -> None:
    """The ``sglang.srt.plugins`` entry point (run in every SGLang process)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(RPC_TARGET, around_rpc, HookType.AROUND)


def around_rpc(original: Callable[..., Any], scheduler: Any, recv_req: Any) -> Any:
    """``Scheduler.handle_rpc_request`` with the ``rollart_*`` methods answered here."""
    method = str(getattr(recv_req, "method", ""))
    if not method.startswith(PREFIX):
        return original(scheduler, recv_req)
    from sglang.srt.managers.io_struct import RpcReqOutput

    try:
        result = handle(method, dict(recv_req.parameters or {}))
    except Exception as exc:  # noqa: BLE001 - answered to the adapter, which raises it
        return RpcReqOutput(success=False, message=f"{type(exc).__name__}: {exc}")
    return RpcReqOutput(success=True, message=json.dumps(result))


def handle(method: str, params: dict[str, Any]) -> Any:
    """One ``rollart_*`` RPC; returns plain JSON data."""
    handlers: dict[str, Callable[..., Any]] = {
        "rollart_ping": lambda: {"loader": LOADER},
        "rollart_stage": _stage,
        "rollart_status": lambda: _staging().status(),
        "rollart_check": _check,
        "rollart_result": _result,
        "rollart_cancel": _cancel,
        "rollart_payload": _payload,
    }
    fn = handlers.get(method)
    if fn is None:
        raise AttributeError(f"unknown rollart RPC {method!r} (known: {sorted(handlers)})")
    return fn(**params)


def _staging() -> Any:
    if _state["staging"] is None:
        from rollart_sdk.weights.direct import WorkerStaging

        _state["staging"] = WorkerStaging()
    return _state["staging"]


def _stage(manifest: str, spec: str) -> None:
    _state["ready"] = None
    _staging().stage(manifest, on_scheduler_device(json.loads(spec)))


def on_scheduler_device(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` wrapped in :class:`OnDevice` when the scheduler runs on a GPU: the staging
    thread is new, and a new thread's current CUDA device is 0, not SGLang's ``gpu_id``."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return spec
    return {"factory": f"{__name__}:OnDevice",
            "kwargs": {"inner": spec, "device": torch.cuda.current_device()}}


class OnDevice:
    """A receiver built from ``inner`` (a transport's ``receiver_spec``) whose ``fetch``
    runs with CUDA device ``device`` current (NCCL receives into the current device)."""

    def __init__(self, role: str, inner: dict[str, Any], device: int) -> None:
        from rollart_sdk.registry import import_string

        self._inner = import_string(inner["factory"])(role=role, **inner.get("kwargs", {}))
        self._device = device

    def fetch(self, manifest: Any) -> Any:
        import torch

        torch.cuda.set_device(self._device)
        yield from self._inner.fetch(manifest)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _cancel(version: int) -> None:
    _staging().cancel(int(version))
    ready = _state["ready"]
    if ready is not None and ready[0] == int(version):
        _state["ready"] = None


def _check(version: int, checkpoint: str) -> int:
    """Take ``version`` out of staging, check it against the checkpoint, hold it for the
    commit; returns its tensor count."""
    from rollart_sdk.backends.engine_adapter import checkpoint_shapes, convert_buckets

    _state["ready"] = None
    buckets = _staging().take(int(version))
    shapes = _state["shapes"].get(checkpoint)
    if shapes is None:
        shapes = _state["shapes"][checkpoint] = checkpoint_shapes(checkpoint)
    checked = convert_buckets(buckets, shapes, lambda b: list(b.tensors.items()))
    _state["ready"] = (int(version), checked)
    return sum(len(t) for t in checked)


def _result(version: int) -> int:
    """What the last commit of ``version`` loaded; raises when it did not."""
    result = _state["result"]
    if result is None or result["version"] != int(version):
        raise RuntimeError(f"version {version} was not loaded by {LOADER} (last: {result})")
    if result["error"]:
        raise RuntimeError(result["error"])
    return int(result["tensors"])


def _payload(version: int) -> list[list[Any]]:
    """The staged version as ``[index, checksum, base64 safetensors]`` per bucket, loading
    nothing (what this process received; the transport kit reads it back)."""
    from safetensors.torch import save

    return [[b.index, b.checksum, base64.b64encode(save(b.tensors)).decode()]
            for b in _staging().take(int(version))]


def load_staged(model: Any, named_tensors: list[tuple[str, Any]]) -> None:
    """SGLang's custom weight loader (``load_format=LOADER``): the checked version named
    by the marker tensor, into ``model`` in one ``load_weights`` call. Never raises."""
    marker = dict(named_tensors).get(MARKER)
    version = -1 if marker is None else int(marker.flatten()[0].item())
    ready, _state["ready"] = _state["ready"], None
    if ready is None or ready[0] != version:
        _state["result"] = {"version": version, "tensors": 0, "error": (
            f"version {version} was not staged and checked in the scheduler (rollart_check "
            f"first; checked: {None if ready is None else ready[0]}); nothing loaded")}
        return
    tensors = [item for bucket in ready[1] for item in bucket]
    try:
        model.load_weights(tensors)
    except Exception as exc:
        log.exception("rollart: loading version %s failed", version)
        _state["result"] = {"version": version, "tensors": 0, "error": (
            f"model.load_weights raised {type(exc).__name__}: {exc} after every tensor "
            "was checked against the checkpoint")}
        return
    _state["result"] = {"version": version, "tensors": len(tensors), "error": None}
