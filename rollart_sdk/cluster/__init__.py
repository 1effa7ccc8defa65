"""Data plane: Workers, the Cluster that runs them on Ray, and the method decorators.

Importing this package does not import Ray; the Cluster does when it is built.
"""

from rollart_sdk.cluster.cluster import Cluster, ClusterMember, ClusterMethod
from rollart_sdk.cluster.worker import (
    ActorGenCls,
    ActorGenWorker,
    ActorTrainCls,
    ActorTrainWorker,
    EnvironmentCls,
    EnvironmentWorker,
    RewardCls,
    RewardWorker,
    Worker,
    WorkerContext,
)
from rollart_sdk.resources.decorators import (
    DispatchSpec,
    check_worker_class,
    dispatch_specs,
    hw_mapping,
    known_schemes,
    register,
    register_serverless,
)
from rollart_sdk.serverless import ServerlessError, ServerlessProxy, serve_function

__all__ = [
    "ActorGenCls",
    "ActorGenWorker",
    "ActorTrainCls",
    "ActorTrainWorker",
    "Cluster",
    "ClusterMember",
    "ClusterMethod",
    "DispatchSpec",
    "EnvironmentCls",
    "EnvironmentWorker",
    "RewardCls",
    "RewardWorker",
    "ServerlessError",
    "ServerlessProxy",
    "Worker",
    "WorkerContext",
    "check_worker_class",
    "dispatch_specs",
    "hw_mapping",
    "known_schemes",
    "register",
    "register_serverless",
    "serve_function",
]
