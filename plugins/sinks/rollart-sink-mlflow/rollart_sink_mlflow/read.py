"""Read back what the sink wrote, with MLflow's own tracking client."""

from __future__ import annotations

import os
from typing import Any


def read_run(tracking_uri: str, experiment: str = "rollart") -> dict[str, Any]:
    """The newest run of ``experiment`` in the store: its ``metrics`` (key -> [(step,
    value)], from ``get_metric_history``), ``params`` and ``status``."""
    if tracking_uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"no MLflow experiment {experiment!r} in {tracking_uri}")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"],
                              max_results=1)
    if not runs:
        raise LookupError(f"no run in experiment {experiment!r} of {tracking_uri}")
    run = runs[0]
    metrics = {key: sorted((m.step, m.value)
                           for m in client.get_metric_history(run.info.run_id, key))
               for key in run.data.metrics}
    return {"run_id": run.info.run_id, "metrics": metrics, "params": dict(run.data.params),
            "status": run.info.status, "name": run.info.run_name}
