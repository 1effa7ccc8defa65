"""rollart-sink-wandb: metric sink ``wandb`` (Weights & Biases, offline by default (the run is kept under the run directory; wandb sync uploads it))."""

from rollart_sink_wandb.sink import WandbOptions, WandbSink

__all__ = ["WandbSink", "WandbOptions"]
