"""A sandboxed SWE-style coding env (rollart plugin ``rollart-env-sandbox``)."""

from rollart_env_sandbox.env import SandboxCodeEnv, SandboxOptions, parse_tool_call
from rollart_env_sandbox.sandbox import Limits, PathRefused, Sandbox, SandboxUnavailable, probe

__all__ = ["Limits", "PathRefused", "Sandbox", "SandboxCodeEnv", "SandboxOptions",
           "SandboxUnavailable", "parse_tool_call", "probe"]
