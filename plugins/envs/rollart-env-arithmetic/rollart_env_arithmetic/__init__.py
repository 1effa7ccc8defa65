"""Arithmetic questions as a text environment (rollart plugin ``rollart-env-arithmetic``)."""

from rollart_env_arithmetic.env import (
    ArithmeticEnv,
    ArithmeticOptions,
    parse_final_number,
    worked_steps,
)

__all__ = ["ArithmeticEnv", "ArithmeticOptions", "parse_final_number", "worked_steps"]
