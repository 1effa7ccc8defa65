"""rollart-sink-tensorboard: metric sink ``tensorboard`` (TensorBoard event files under the run directory (scalars, config and samples as text))."""

from rollart_sink_tensorboard.sink import TensorBoardOptions, TensorBoardSink

__all__ = ["TensorBoardSink", "TensorBoardOptions"]
