"""FrozenLake as a text environment for LLM agents (rollart plugin ``rollart-env-frozenlake``)."""

from rollart_env_frozenlake.env import ACTIONS, FrozenLakeOptions, FrozenLakeTextEnv, parse_action

__all__ = ["ACTIONS", "FrozenLakeOptions", "FrozenLakeTextEnv", "parse_action"]
