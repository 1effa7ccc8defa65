"""Resource plane: pools, the plan checked at validation, placement policies and the
ResourceManager that binds workers to pools on Ray and records each binding."""

from rollart_sdk.resources.manager import Binding, BindingStore, ResourceManager, read_bindings
from rollart_sdk.resources.placement import AffinityPlacement, PackPlacement, SpreadPlacement
from rollart_sdk.resources.plan import (
    ROLE_PROFILES,
    ROLES,
    ResourcePlan,
    RolePlan,
    default_role_pools,
    plan_resources,
    pool_resource,
)

__all__ = [
    "ROLES",
    "ROLE_PROFILES",
    "AffinityPlacement",
    "Binding",
    "BindingStore",
    "PackPlacement",
    "ResourceManager",
    "ResourcePlan",
    "RolePlan",
    "SpreadPlacement",
    "default_role_pools",
    "plan_resources",
    "pool_resource",
    "read_bindings",
]
