"""rollart-reward-closeness: a rollart reward plugin."""
