"""rollart-env-example: a rollart env plugin."""
