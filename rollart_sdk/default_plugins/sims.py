"""Built-in ``sim`` backends: engine, trainer, env, reward and transport that model time.

They are built in (not a plugin package) because ``rollart sim`` and ``clock: simulated``
are core commands that must work on a bare install, and they need nothing beyond the core's
own dependencies. They run only under simulated time, hosted by the real role workers
(and the virtual-time env host), which offer them the run's ``sim`` context
(:class:`rollart_sdk.sim.backends.SimContext`); they sleep their modelled costs on the
virtual clock (docs/simulation.md)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl

_ONLY = " (simulated time only: rollart sim)"


@hookimpl
def rollart_register_engines(registry):
    registry.register("sim", factory="rollart_sdk.sim.engine:create_engine",
                      options="rollart_sdk.sim.engine:SimEngineOptions",
                      summary="roofline cost model of continuous batching" + _ONLY,
                      traits={"simulated": True}, process_local=True)


@hookimpl
def rollart_register_trainers(registry):
    registry.register("sim", factory="rollart_sdk.sim.backends:create_trainer",
                      options="rollart_sdk.sim.backends:SimTrainerOptions",
                      summary="train step time from FLOPs per token" + _ONLY,
                      traits={"simulated": True}, process_local=True)


@hookimpl
def rollart_register_envs(registry):
    registry.register("sim", factory="rollart_sdk.sim.backends:SimEnv",
                      options="rollart_sdk.sim.backends:SimEnvOptions",
                      summary="a task's workload: turns, latencies, failures, tokens" + _ONLY,
                      traits={"simulated": True})


@hookimpl
def rollart_register_rewards(registry):
    registry.register("sim", factory="rollart_sdk.sim.backends:SimReward",
                      options="rollart_sdk.sim.backends:SimRewardOptions",
                      summary="serverless reward with cold/warm latencies" + _ONLY,
                      traits={"simulated": True})


@hookimpl
def rollart_register_transports(registry):
    registry.register("sim", factory="rollart_sdk.sim.backends:SimTransport",
                      options="rollart_sdk.sim.backends:SimTransportOptions",
                      summary="weight transfer bandwidths (pull or push)" + _ONLY,
                      traits={"simulated": True}, process_local=True)
