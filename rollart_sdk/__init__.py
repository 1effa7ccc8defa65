"""rollart-sdk: disaggregated, trajectory-level asynchronous agentic RL (ROLLART) as plugins."""

from rollart_sdk.hookspecs import hookimpl

__all__ = ["hookimpl", "__version__"]
__version__ = "0.1.0"
