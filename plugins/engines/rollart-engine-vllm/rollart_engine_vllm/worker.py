"""The vLLM worker extension that loads rollart weight buckets in place.

vLLM mixes ``worker_extension_cls`` into every worker; the engine adapter calls these
methods through ``AsyncLLM.collective_rpc`` (one call per bucket, on every TP rank):

1. ``rollart_begin_update``: ``initialize_layerwise_reload(model)`` - vLLM's CPU backend
   (and quantized layers on GPU) repack linear weights after loading, so a plain
   ``model.load_weights`` on a live model fails; the layer-wise reload restores the
   loadable layout first (and :class:`RotaryReloadFilter` drops the reload's warning for
   rotary embeddings, whose cos/sin cache no checkpoint holds);
2. ``rollart_load_bucket(payload)``: ``model.load_weights`` on one bucket. The bucket
   arrives as safetensors bytes: ``collective_rpc`` serialises its arguments with
   msgspec, which turns tensors into nested lists;
3. ``rollart_finish_update``: ``finalize_layerwise_reload`` re-applies the kernel layout.

A tied embedding (SmolLM2, Qwen3 up to 4B, Llama 3.2) comes once, as
``model.embed_tokens.weight`` (the trainer sends no alias:
``rollart_sdk.weights.without_aliases``). vLLM ties ``lm_head`` to the embedding, but the
layer-wise reload tracks each layer on its own: ``lm_head`` received nothing, so the
reload put its old values back ("ParallelLMHead: Failed to load weights") and the model
served new embeddings with the old output layer (1.2 nats off on SmolLM2). The
embedding is therefore loaded under ``lm_head.weight`` too (:func:`with_tied_head`).

The collective path (a push transport such as ``nccl``; ``rollart_sdk.weights.direct``):
the worker joins the trainer's weight-update group itself, so the tensors never pass
through ``collective_rpc``:

- ``rollart_stage(manifest_json, spec)``: start receiving the version in a background
  thread of this worker (a ``WorkerStaging``: the transport's receiver, built from
  ``spec``, verifying every bucket's checksum); returns at once, generation goes on;
- ``rollart_staged_status()``: that transfer's status (arrived, failed);
- ``rollart_check_staged(version, checkpoint)``: the staged buckets, checked by name and
  shape against the served checkpoint (before the engine aborts anything, the model is
  untouched), then ``rollart_commit_staged(version)`` loads them as in 1-3;
- ``rollart_cancel_staged(version)``: drop it.

Runs inside vLLM's worker process: it imports vLLM freely.
"""

from __future__ import annotations

import logging
from typing import Any

# vLLM's layer-wise reload logs here (vllm/model_executor/model_loader/reload/layerwise.py).
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class RotaryReloadFilter(logging.Filter):
    """Drops one line of vLLM's layer-wise reload: "<Layer>: Failed to load weights" for a
    rotary embedding. The reload warns for every layer with loadable tensors that received
    none; a rotary embedding's only tensor is its cos/sin cache, a buffer that no
    checkpoint holds (the trainer never sends it), which the reload puts back from the
    live model. So every weight update printed it once per model, looking like an error.
    The same warning for any other layer (a weight the trainer did not send) still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.msg == "%s: Failed to load weights" and len(args) == 1
                    and str(args[0]).endswith("RotaryEmbedding"))


def quiet_rotary_reload() -> None:
    """Install :class:`RotaryReloadFilter` on vLLM's reload logger (once per process)."""
    log = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, RotaryReloadFilter) for f in log.filters):
        log.addFilter(RotaryReloadFilter())


EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def with_tied_head(tensors: dict[str, Any], model: Any) -> dict[str, Any]:
    """``tensors`` plus ``lm_head.weight`` = the embedding when ``model`` ties them and the
    bucket holds the embedding but not the head (see the module docstring)."""
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if tied and EMBED in tensors and HEAD not in tensors:
        return {**tensors, HEAD: tensors[EMBED]}
    return tensors


class RollartWorkerExtension:
    """Mixed into vLLM's worker (``self.model_runner`` is the worker's model runner)."""

    def _rollart_model(self) -> Any:
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def rollart_begin_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        quiet_rotary_reload()
        initialize_layerwise_reload(self._rollart_model())
        self._rollart_loaded = 0

    def rollart_load_bucket(self, payload: bytes) -> int:
        from safetensors.torch import load

        tensors = load(bytes(payload))
        model = self._rollart_model()
        model.load_weights(weights=list(with_tied_head(tensors, model).items()))
        self._rollart_loaded = getattr(self, "_rollart_loaded", 0) + len(tensors)
        return len(tensors)

    def rollart_finish_update(self) -> int:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self._rollart_model()
        finalize_layerwise_reload(model, self.model_runner.model_config)  # type: ignore[attr-defined]
        return int(getattr(self, "_rollart_loaded", 0))

    # ------------------------------------------------------------------ collective path
    def _rollart_staging(self) -> Any:
        staging = getattr(self, "_rollart_staging_obj", None)
        if staging is None:
            from rollart_sdk.weights.direct import WorkerStaging

            staging = self._rollart_staging_obj = WorkerStaging()
        return staging

    def rollart_stage(self, manifest_json: str, spec: dict[str, Any]) -> None:
        self._rollart_staging().stage(manifest_json, spec)

    def rollart_staged_status(self) -> dict[str, Any]:
        status: dict[str, Any] = self._rollart_staging().status()
        return status

    def rollart_cancel_staged(self, version: int) -> None:
        self._rollart_staging().cancel(version)

    def rollart_check_staged(self, version: int, checkpoint: str) -> int:
        """Take the staged ``version`` out of staging and check every bucket's names and
        shapes against the served checkpoint (raises before anything is touched; the
        engine calls it before it aborts in-flight requests). Returns its tensor count."""
        from rollart_sdk.backends.engine_adapter import checkpoint_shapes, convert_buckets

        self._rollart_ready: tuple[int, list[dict[str, Any]]] | None = None
        buckets = self._rollart_staging().take(version)
        shapes = getattr(self, "_rollart_shapes", None)
        if shapes is None:
            shapes = self._rollart_shapes = checkpoint_shapes(checkpoint)
        checked = convert_buckets(buckets, shapes, lambda b: b.tensors)
        self._rollart_ready = (version, checked)
        return sum(len(t) for t in checked)

    def rollart_commit_staged(self, version: int) -> int:
        """Load the checked ``version`` (``rollart_check_staged``); returns the tensors
        loaded."""
        ready = getattr(self, "_rollart_ready", None)
        if ready is None or ready[0] != version:
            raise RuntimeError(f"version {version} was not staged and checked on this worker "
                               "(rollart_check_staged first)")
        self._rollart_ready = None
        self.rollart_begin_update()
        try:
            model = self._rollart_model()
            for tensors in ready[1]:
                model.load_weights(weights=list(with_tied_head(tensors, model).items()))
                self._rollart_loaded += len(tensors)
        finally:
            loaded = self.rollart_finish_update()
        return loaded

    def rollart_staged_payload(self, version: int) -> list[tuple[int, str, bytes]]:
        """Take the staged ``version`` out of staging as ``(index, checksum, safetensors
        bytes)`` per bucket, loading nothing: what this worker received, for the
        transport conformance kit (tests/test_collective.py)."""
        from safetensors.torch import save

        return [(b.index, b.checksum, save(b.tensors))
                for b in self._rollart_staging().take(version)]

    def rollart_weight(self, name: str) -> list[float]:
        """A parameter's values by vLLM name (tests compare them with what was sent)."""
        params = dict(self._rollart_model().named_parameters())
        return params[name].detach().float().flatten().tolist()
