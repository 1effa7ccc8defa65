from rollart_sdk import hookimpl


@hookimpl
def rollart_register_envs(registry):
    registry.register(
        "guess",
        factory="rollart_env_guess.env:GuessEnv",
        options="rollart_env_guess.env:GuessOptions",
        summary="guess a secret number; the env answers higher / lower",
    )
