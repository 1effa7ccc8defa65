"""rollart-env-hilo: a rollart env plugin."""
