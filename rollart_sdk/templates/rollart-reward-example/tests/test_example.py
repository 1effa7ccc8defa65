import rollart_reward_example.plugin as plugin
from rollart_reward_example.reward import ExampleReward

from rollart_sdk.testing.reward import check_reward, make_request


def test_conforms():
    check_reward(ExampleReward(), [
        (make_request(env_return=1.0, info={"success": True}, trajectory_id="a"), 2.0),
        (make_request(env_return=0.0, info={"success": False}, trajectory_id="b"), 0.0),
    ])


def test_registers(register_plugin):
    backend = register_plugin(plugin).registry.get("reward", "example").create(
        {"use_env_return": False})
    check_reward(backend, [(make_request(env_return=1.0, info={"success": True}), 1.0)])
