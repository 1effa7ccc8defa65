"""Moved to :mod:`rollart_sdk.cluster.envs.process` (the process host, its ``EnvHost``
class now ``EnvProcess``) and :mod:`rollart_sdk.cluster.envs.errors`; this path
re-exports them for one release (CHANGELOG.md)."""

from rollart_sdk.cluster.envs.errors import EnvCallError, EnvHung, EnvProcessDied
from rollart_sdk.cluster.envs.process import EnvProcess, HostPool

EnvHost = EnvProcess

__all__ = ["EnvCallError", "EnvHost", "EnvHung", "EnvProcessDied", "HostPool"]
