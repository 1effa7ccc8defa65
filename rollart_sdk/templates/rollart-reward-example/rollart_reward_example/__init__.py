"""rollart-reward-example: a rollart reward plugin."""
