"""rollart-placement-example: a rollart placement plugin."""
