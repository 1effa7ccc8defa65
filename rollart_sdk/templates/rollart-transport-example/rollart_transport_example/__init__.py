"""rollart-transport-example: a rollart transport plugin."""
