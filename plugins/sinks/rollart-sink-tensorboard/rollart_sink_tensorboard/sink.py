"""Metric sink ``tensorboard``: TensorBoard event files (``<run_dir>/tensorboard``).

Each step's metrics are scalars at that step (``tensorboard --logdir RUN_DIR``), the run
config is a text entry (``config``, YAML), and the step's samples (samples.jsonl's lines)
are text entries ``samples/<tag>``. The writer is torch's ``SummaryWriter``, which needs
the ``tensorboard`` package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.control.sinks import sample_text


class TensorBoardOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log_dir: str = Field("tensorboard", description="folder of the event files; a "
                         "relative path is under the run directory")
    samples: bool = Field(True, description="also write each step's samples "
                          "(samples.jsonl) as text entries, one per task")
    flush_secs: float = Field(10.0, gt=0, description="seconds between flushes to disk "
                              "(also flushed at the run's end)")


class TensorBoardSink:
    """Writes a run's metrics, config and samples as TensorBoard events."""

    def __init__(self, run_dir: str, run_name: str, log_dir: str = "tensorboard",
                 samples: bool = True, flush_secs: float = 10.0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / log_dir  # an absolute log_dir stays itself
        self.samples = samples
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=int(flush_secs))

    def log_config(self, config: dict[str, Any]) -> None:
        text = yaml.safe_dump(config, sort_keys=False)
        # Markdown: indented four spaces, a code block (TensorBoard renders text as Markdown).
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.samples:
            return
        by_tag: dict[str, list[str]] = {}
        for row in rows:
            by_tag.setdefault(str(row.get("tag")), []).append(sample_text(row))
        for tag, texts in by_tag.items():
            self.writer.add_text(f"samples/{tag}", "\n\n---\n\n".join(texts), step)

    def close(self) -> None:
        self.writer.close()
