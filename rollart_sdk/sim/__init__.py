"""Simulated time: the real control plane on a virtual clock, with cost-model backends.

``rollart sim CONFIG`` runs a job (:mod:`rollart_sdk.sim.job`); ``rollart sim --experiment
NAME`` reproduces a figure of the paper with the benchmark suite's harness
(``rollart_benchmark_suite.paper``, benchmark ``paper``) over this package's
:func:`~rollart_sdk.sim.job.simulate` and :mod:`~rollart_sdk.sim.workloads`. The models and
their limits: docs/simulation.md. Importing this package imports nothing heavy.
"""
