"""The env hosts: where an environment's ``reset``/``step``/``close`` run.

Each implements :class:`rollart_sdk.cluster.hosts.EnvHost` and raises the errors of
:mod:`~rollart_sdk.cluster.envs.errors`:

- :mod:`~rollart_sdk.cluster.envs.process`: ``env_host: worker``, the environment role's
  :class:`EnvWorker`, each env in its own killable process;
- :mod:`~rollart_sdk.cluster.envs.inline`: ``env_host: inline``, :class:`InlineEnvWorker`,
  called on the control plane's event loop;
- :mod:`~rollart_sdk.cluster.envs.thread`: ``env_host: thread``, :class:`ThreadEnvWorker`,
  each call on a thread of the control plane's process;
- :mod:`~rollart_sdk.cluster.envs.virtual`: :class:`VirtualEnvHost`, envs that model their
  latency (env ``sim``) slept on a virtual-time loop (``rollart sim``).

:mod:`~rollart_sdk.cluster.envs.hosting` picks a task's host;
:mod:`~rollart_sdk.cluster.envs.faults` injects faults into an env (worker hosts).
"""

from rollart_sdk.cluster.envs.errors import EnvCallError, EnvHung, EnvProcessDied
from rollart_sdk.cluster.envs.inline import InlineEnvWorker
from rollart_sdk.cluster.envs.process import EnvWorker
from rollart_sdk.cluster.envs.thread import ThreadEnvWorker
from rollart_sdk.cluster.envs.virtual import VirtualEnvHost

__all__ = ["EnvCallError", "EnvHung", "EnvProcessDied", "EnvWorker", "InlineEnvWorker",
           "ThreadEnvWorker", "VirtualEnvHost"]
