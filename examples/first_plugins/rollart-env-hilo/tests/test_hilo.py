import rollart_env_hilo.plugin as plugin
from rollart_env_hilo.env import HiloEnv

from rollart_sdk.testing.env import check_env


def test_conforms():
    check_env(HiloEnv, seed=0)


def test_binary_search_wins_within_four_guesses():
    for seed in range(20):
        env = HiloEnv()
        env.reset(seed=seed)
        low, high = 0, 9
        for _ in range(4):
            guess = (low + high) // 2
            obs, reward, terminated, truncated, info = env.step(str(guess))
            if obs == "Higher.":
                low = guess + 1
            elif obs == "Lower.":
                high = guess - 1
            else:
                break
        assert (reward, terminated, info["success"]) == (1.0, True, True), seed


def test_registers(register_plugin):
    env = register_plugin(plugin).registry.get("env", "hilo").create({"max_guesses": 2})
    assert env.options.max_guesses == 2
