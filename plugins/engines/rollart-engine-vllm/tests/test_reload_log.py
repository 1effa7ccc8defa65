"""vLLM's layer-wise reload warns "<Layer>: Failed to load weights" for every layer with
loadable tensors that received none in an update. A rotary embedding's cos/sin cache is in
no checkpoint, so every weight update printed "RotaryEmbedding: Failed to load weights";
the worker extension drops that line and keeps the warning for any other layer. (No vLLM
needed: the filter is plain logging; the SmolLM2 run in test_smollm2.py shows the line
gone from a real vLLM worker.)"""

from __future__ import annotations

import logging

from rollart_engine_vllm.worker import RELOAD_LOGGER, RotaryReloadFilter, quiet_rotary_reload


def _warned(layer: str) -> logging.LogRecord:
    return logging.LogRecord(RELOAD_LOGGER, logging.WARNING, "layerwise.py", 266,
                             "%s: Failed to load weights", (layer,), None)


def test_the_rotary_line_is_dropped_and_any_other_layer_is_kept() -> None:
    f = RotaryReloadFilter()
    assert not f.filter(_warned("RotaryEmbedding"))
    assert not f.filter(_warned("Llama3RotaryEmbedding"))
    assert f.filter(_warned("QKVParallelLinear"))  # a weight the trainer did not send
    assert f.filter(_warned("VocabParallelEmbedding"))
    other = logging.LogRecord(RELOAD_LOGGER, logging.WARNING, "layerwise.py", 209,
                              "Allocating %.1f MB of device memory to buffers", (1.0,), None)
    assert f.filter(other)


def test_installing_twice_adds_one_filter_and_the_logger_drops_the_line(caplog) -> None:
    log = logging.getLogger(RELOAD_LOGGER)
    before = list(log.filters)
    try:
        quiet_rotary_reload()
        quiet_rotary_reload()
        assert sum(isinstance(f, RotaryReloadFilter) for f in log.filters) == 1
        with caplog.at_level(logging.WARNING, logger=RELOAD_LOGGER):
            log.warning("%s: Failed to load weights", "RotaryEmbedding")
            log.warning("%s: Failed to load weights", "RowParallelLinear")
        assert [r.getMessage() for r in caplog.records] == [
            "RowParallelLinear: Failed to load weights"]
    finally:
        log.filters[:] = before
