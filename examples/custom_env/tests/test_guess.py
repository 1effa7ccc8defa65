import rollart_env_guess.plugin as plugin
from rollart_env_guess.env import GuessEnv

from rollart_sdk.testing.env import check_env


def test_conforms():
    check_env(GuessEnv, seed=0)


def test_binary_search_finds_the_secret():
    env = GuessEnv(low=1, high=100, max_guesses=7)
    env.reset(seed=42)
    low, high = 1, 100
    for _ in range(7):
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(f"My guess: {guess}")
        if obs == "Higher.":
            low = guess + 1
        elif obs == "Lower.":
            high = guess - 1
        else:
            break
    assert (obs, reward, terminated, info["success"]) == ("Correct!", 1.0, True, True)


def test_registers(register_plugin):
    # register_plugin (a fixture of rollart-sdk's pytest plugin) loads the module as a
    # plugin without installing anything; create() validates options like a run would.
    env = register_plugin(plugin).registry.get("env", "guess").create({"high": 10})
    assert env.reset(seed=0)[0] == "Guess a number between 1 and 10."
