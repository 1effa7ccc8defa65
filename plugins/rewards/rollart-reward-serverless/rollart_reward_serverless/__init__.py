"""Serverless reward (ROLLART R3): score trajectories on a stateless endpoint."""
