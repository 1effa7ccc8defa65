import rollart_reward_closeness.plugin as plugin
from rollart_reward_closeness.reward import ClosenessReward

from rollart_sdk.testing.reward import check_reward, make_request


def test_conforms():
    check_reward(ClosenessReward(), [
        (make_request(info={"success": True}, trajectory_id="a"), 1.0),
        (make_request(info={"success": False, "distance": 3, "high": 9}, trajectory_id="b"),
         0.5 * (1 - 3 / 9)),
        (make_request(info={}, trajectory_id="c"), 0.0),  # no facts: no credit
    ])


def test_registers(register_plugin):
    backend = register_plugin(plugin).registry.get("reward", "closeness").create({"partial": 1.0})
    check_reward(backend, [(make_request(info={"distance": 0, "high": 9}), 1.0)])
