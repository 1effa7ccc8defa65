"""The run configuration, in one package: what a run's YAML may hold, how it is read, and
what the names in it resolve to.

- :mod:`~rollart_sdk.config.schema`: the pydantic models (``RunConfig`` and its sections);
- :mod:`~rollart_sdk.config.files`: reading a config file safely (UTF-8, bounded YAML, no
  repeated keys) into its data and a :class:`LineMap` (dotted key -> YAML line);
- :mod:`~rollart_sdk.config.overrides`: dotted command-line overrides (``rollout.alpha=2``);
- :mod:`~rollart_sdk.config.load`: ``load_config``, the three together, each problem
  reported with its key and line::

      invalid configuration in examples/quickstart.yaml:
        rollout.alpha (line 41): Input should be greater than or equal to 0 (got -1)

- :mod:`~rollart_sdk.config.resolve`: every backend the config names, found among the
  installed plugins and its options validated by that plugin (``resolve_run``).

The checks that need the model, the envs and the tokenizer before any worker starts are
the composition root's (:mod:`rollart_sdk.job.preflight`).
"""

from __future__ import annotations

from rollart_sdk.config.files import MAX_NODES, LineMap, parse_yaml, read_config_file
from rollart_sdk.config.load import load_config
from rollart_sdk.config.overrides import apply_override, parse_override
from rollart_sdk.config.schema import (
    Backend,
    EnvBackend,
    EvalConfig,
    EvalSamplingConfig,
    FaultConfig,
    GenRoleConfig,
    LatencyConfig,
    ModelConfig,
    PhaseConfig,
    PoolConfig,
    PoolKind,
    RayConfig,
    RoleConfig,
    RolesConfig,
    RolloutConfig,
    RunConfig,
    SamplingConfig,
    TaskConfig,
    TinyModelConfig,
    TrainConfig,
)
from rollart_sdk.config.sim import SimConfig

__all__ = [
    "MAX_NODES", "Backend", "EnvBackend", "EvalConfig", "EvalSamplingConfig", "FaultConfig",
    "GenRoleConfig", "LatencyConfig", "LineMap", "ModelConfig", "PhaseConfig", "PoolConfig",
    "PoolKind", "RayConfig", "RoleConfig", "RolesConfig", "RolloutConfig", "RunConfig",
    "SamplingConfig", "SimConfig", "TaskConfig", "TinyModelConfig", "TrainConfig",
    "apply_override", "load_config", "parse_override", "parse_yaml", "read_config_file",
]
