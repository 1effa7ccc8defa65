"""rollart-benchmark-example: a rollart benchmark plugin."""
