"""rollart-trainer-example: a rollart trainer plugin."""
