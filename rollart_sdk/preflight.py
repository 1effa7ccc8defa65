"""Moved to :mod:`rollart_sdk.job.preflight` (the checks the composition root runs before
any worker starts) and :mod:`rollart_sdk.job.env_probe` (the envs built for them); this
path re-exports them for one release (CHANGELOG.md)."""

from rollart_sdk.job.env_probe import (
    EnvProbe,
    describe_env,
    env_facts,
    first_observation,
    first_observations,
    probe_env,
    probe_envs,
)
from rollart_sdk.job.preflight import (
    Preflight,
    Problems,
    check_actions,
    check_context,
    check_env_pools,
    check_gguf,
    check_model,
    check_model_shape,
    check_output_dir,
    check_pd,
    check_precision,
    check_prefill,
    check_shape,
    option_clash_warnings,
    preflight,
    sampling_warnings,
    system_prompt,
    task_formats,
)

__all__ = [
    "EnvProbe", "Preflight", "Problems", "check_actions", "check_context", "check_env_pools",
    "check_gguf", "check_model", "check_model_shape", "check_output_dir", "check_pd", "check_precision",
    "check_prefill", "check_shape", "describe_env", "env_facts", "first_observation",
    "first_observations", "option_clash_warnings", "preflight", "probe_env", "probe_envs",
    "sampling_warnings", "system_prompt", "task_formats",
]
