"""Simulated time: the real control plane on a virtual clock, with cost-model backends.

``rollart sim CONFIG`` runs a job (:mod:`rollart_sdk.sim.job`); ``rollart sim --experiment
NAME`` reproduces a figure of the paper (:mod:`rollart_sdk.sim.experiments`). The models
and their limits: docs/simulation.md. Importing this package imports nothing heavy.
"""
