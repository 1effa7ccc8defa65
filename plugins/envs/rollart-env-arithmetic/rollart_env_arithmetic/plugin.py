"""Registers env ``arithmetic``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    registry.register(
        "arithmetic",
        factory="rollart_env_arithmetic.env:ArithmeticEnv",
        options="rollart_env_arithmetic.env:ArithmeticOptions",
        summary="compute a+b / a-b / a*b; free-text answer, reward 1 when the final number is right",
        traits={"turns": "turns attempts (default 1)",
                "character": "decode-heavy: a short prompt, a long worked answer (answer_style: steps)"},
    )
    registry.register(
        "guess",
        factory="rollart_env_arithmetic.guess:GuessEnv",
        options="rollart_env_arithmetic.guess:GuessOptions",
        summary="guess a number in low..high; after a wrong guess the env says too low / too high",
        traits={"turns": "turns guesses (default 3)",
                "character": "multi-turn, one number token a turn; the best guess depends on "
                             "the feedback"},
    )
