"""Metric sink ``mlflow``: an MLflow run, in a local file store under the run directory
(``<run_dir>/mlruns``) unless ``tracking_uri`` names another store or server.

Each step's metrics are logged at that step (``log_batch``; in a file store with ``.``
for ``/``, see :func:`metric_key`), the run config as params
(dotted keys, e.g. ``rollout.batch_size``) and as the artifact ``config.json``. Read it
with ``mlflow ui --backend-store-uri RUN_DIR/mlruns`` or ``MlflowClient(tracking_uri=...)``.
MLflow 3 keeps its file store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is set: this sink sets it (if unset) for a ``file:`` store.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_PARAMS = 100  # params per log_batch call (MLflow's limit)
MAX_METRICS = 1000  # metrics per log_batch call
MAX_PARAM_CHARS = 500


class MlflowOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI (sqlite:///..., http://...); unset: a file "
        "store at file:<run dir>/mlruns")
    experiment: str = Field("rollart", description="MLflow experiment the run is logged in "
                            "(created if missing)")
    name: str | None = Field(None, description="the MLflow run's name; unset: the run "
                             "directory's name")
    tags: dict[str, str] = Field(default_factory=dict,
                                 description="tags set on the MLflow run (name: value)")


class MlflowSink:
    """Logs a run's metrics and config to one MLflow run."""

    def __init__(self, run_dir: str, run_name: str, tracking_uri: str | None = None,
                 experiment: str = "rollart", name: str | None = None,
                 tags: dict[str, str] | None = None) -> None:
        uri = tracking_uri or (Path(run_dir).resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.tracking_uri = uri
        self.file_store = uri.startswith("file:")
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        run = self.client.create_run(exp_id, run_name=name or run_name, tags=dict(tags or {}))
        self.run_id = run.info.run_id

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.client.log_dict(self.run_id, config, "config.json")
        params = [Param(k, v[:MAX_PARAM_CHARS]) for k, v in _dotted(config).items()]
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(metric_key(k, self.file_store), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(rows), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=rows[i:i + MAX_METRICS])

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


def metric_key(key: str, file_store: bool = False) -> str:
    """``key`` with the characters MLflow refuses in a name (it takes letters, digits and
    ``_ - . space : /``) replaced by ``_``. In a file store a metric is a file named by its
    key, so ``env/failures`` and ``env/failures/<tag>`` (both in a metrics line) would be a
    file and a folder of one name: there ``/`` becomes ``.`` (``env.failures.<tag>``)."""
    key = re.sub(r"[^\w\-. :/]", "_", key)
    return key.replace("/", ".") if file_store else key


def _dotted(obj: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"a.b.c": "value"}`` (lists by index)."""
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return {prefix: str(obj)}
    out: dict[str, str] = {}
    for k, v in items:
        out.update(_dotted(v, f"{prefix}.{k}" if prefix else str(k)))
    return out
