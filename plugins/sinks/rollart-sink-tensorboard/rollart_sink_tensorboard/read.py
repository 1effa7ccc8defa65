"""Read back what the sink wrote, with TensorBoard's own reader (EventAccumulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _accumulator(log_dir: str | Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``log_dir``: tag -> [(step, value)]."""
    acc = _accumulator(log_dir)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def read_texts(log_dir: str | Path) -> dict[str, list[tuple[int, str]]]:
    """Every text entry (config, samples/<tag>): tag -> [(step, text)] (torch's writer
    files ``X`` as ``X/text_summary``; the tag here is ``X``)."""
    acc = _accumulator(log_dir)
    out: dict[str, list[tuple[int, str]]] = {}
    for tag in acc.Tags()["tensors"]:
        out[tag.removesuffix("/text_summary")] = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
    return out
