"""Metric sink ``wandb``: a Weights & Biases run, offline by default, kept under the run
directory (``<run_dir>/wandb/offline-run-*``; ``wandb sync`` uploads it later).

Each step's metrics are logged at that step, the run config is the W&B config, and the
step's samples (samples.jsonl's lines) are a table ``samples`` (step, task, outcome,
reward, trajectory, text). ``mode: online`` needs a W&B login and the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.control.sinks import sample_text

COLUMNS = ["step", "tag", "outcome", "reward", "trajectory", "text"]


class WandbOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field("rollart", description="W&B project the run is logged in")
    entity: str | None = Field(None, description="W&B entity (user or team); unset: "
                               "wandb's default")
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline writes under the run directory (upload later with "
        "`wandb sync`); online needs WANDB_API_KEY and network")
    dir: str = Field(".", description="where wandb keeps its files (it adds wandb/); a "
                     "relative path is under the run directory")
    name: str | None = Field(None, description="the W&B run's name; unset: the run "
                             "directory's name")
    tags: list[str] = Field(default_factory=list, description="tags of the W&B run")
    samples: bool = Field(True, description="also log each step's samples as a table")


class WandbSink:
    """Logs a run's metrics, config and samples to one W&B run."""

    def __init__(self, run_dir: str, run_name: str, project: str = "rollart",
                 entity: str | None = None,
                 mode: Literal["offline", "online", "disabled"] = "offline",
                 dir: str = ".",
                 name: str | None = None, tags: list[str] | None = None,
                 samples: bool = True) -> None:
        import wandb

        self.samples = samples
        self.dir = Path(run_dir) / dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project, entity=entity, mode=mode, dir=str(self.dir),
            name=name or run_name, tags=list(tags or []), reinit="create_new",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.samples:
            return
        import wandb

        data = [[step, row.get("tag"), row.get("outcome"), row.get("reward"),
                 row.get("trajectory"), sample_text(row)] for row in rows]
        columns: list[str | int] = [*COLUMNS]
        self.run.log({"samples": wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self.run.finish()
