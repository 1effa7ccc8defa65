"""rollart-sink-mlflow: metric sink ``mlflow`` (MLflow tracking (a local file store under the run directory by default))."""

from rollart_sink_mlflow.sink import MlflowOptions, MlflowSink

__all__ = ["MlflowSink", "MlflowOptions"]
