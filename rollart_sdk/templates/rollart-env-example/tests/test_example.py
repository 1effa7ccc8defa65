import rollart_env_example.plugin as plugin
from rollart_env_example.env import ExampleEnv

from rollart_sdk.testing.env import check_env


def test_conforms():
    check_env(ExampleEnv, seed=0)


def test_repeating_the_word_succeeds():
    env = ExampleEnv()
    obs, _ = env.reset(seed=1)
    word = obs.split(": ", 1)[1]
    _, reward, terminated, _, info = env.step(word)
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_registers(register_plugin):
    env = register_plugin(plugin).registry.get("env", "example").create({"max_replies": 2})
    assert env.options.max_replies == 2
