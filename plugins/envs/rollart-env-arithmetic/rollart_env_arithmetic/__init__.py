"""Arithmetic questions as a text environment (rollart plugin ``rollart-env-arithmetic``)."""

from rollart_env_arithmetic.env import (
    ArithmeticEnv,
    ArithmeticOptions,
    parse_final_number,
    worked_steps,
)
from rollart_env_arithmetic.guess import GuessEnv, GuessOptions, baselines, parse_guess

__all__ = ["ArithmeticEnv", "ArithmeticOptions", "parse_final_number", "worked_steps",
           "GuessEnv", "GuessOptions", "baselines", "parse_guess"]
