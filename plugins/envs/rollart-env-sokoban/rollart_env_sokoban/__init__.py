"""Sokoban as a multi-turn text environment (rollart plugin ``rollart-env-sokoban``)."""

from rollart_env_sokoban.env import ACTIONS, SokobanOptions, SokobanTextEnv, parse_action
from rollart_env_sokoban.levels import LEVELS, Level, generate_level, parse_level, solve

__all__ = [
    "ACTIONS",
    "LEVELS",
    "Level",
    "SokobanOptions",
    "SokobanTextEnv",
    "generate_level",
    "parse_level",
    "parse_action",
    "solve",
]
