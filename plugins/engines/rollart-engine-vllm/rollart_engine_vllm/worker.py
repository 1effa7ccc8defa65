"""The vLLM worker extension that loads rollart weight buckets in place.

vLLM mixes ``worker_extension_cls`` into every worker; the engine adapter calls these
methods through ``AsyncLLM.collective_rpc`` (one call per bucket, on every TP rank):

1. ``rollart_begin_update``: ``initialize_layerwise_reload(model)`` - vLLM's CPU backend
   (and quantized layers on GPU) repack linear weights after loading, so a plain
   ``model.load_weights`` on a live model fails; the layer-wise reload restores the
   loadable layout first;
2. ``rollart_load_bucket(payload)``: ``model.load_weights`` on one bucket. The bucket
   arrives as safetensors bytes: ``collective_rpc`` serialises its arguments with
   msgspec, which turns tensors into nested lists;
3. ``rollart_finish_update``: ``finalize_layerwise_reload`` re-applies the kernel layout.

Runs inside vLLM's worker process: it imports vLLM freely.
"""

from __future__ import annotations

from typing import Any


class RollartWorkerExtension:
    """Mixed into vLLM's worker (``self.model_runner`` is the worker's model runner)."""

    def _rollart_model(self) -> Any:
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def rollart_begin_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self._rollart_model())
        self._rollart_loaded = 0

    def rollart_load_bucket(self, payload: bytes) -> int:
        from safetensors.torch import load

        tensors = load(bytes(payload))
        self._rollart_model().load_weights(weights=list(tensors.items()))
        self._rollart_loaded = getattr(self, "_rollart_loaded", 0) + len(tensors)
        return len(tensors)

    def rollart_finish_update(self) -> int:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self._rollart_model()
        finalize_layerwise_reload(model, self.model_runner.model_config)  # type: ignore[attr-defined]
        return int(getattr(self, "_rollart_loaded", 0))

    def rollart_weight(self, name: str) -> list[float]:
        """A parameter's values by vLLM name (tests compare them with what was sent)."""
        params = dict(self._rollart_model().named_parameters())
        return params[name].detach().float().flatten().tolist()
