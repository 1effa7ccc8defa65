"""rollart-engine-example: a rollart engine plugin."""
