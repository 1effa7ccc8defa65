import rollart_placement_example.plugin as plugin
from rollart_placement_example.placement import ExamplePlacement


def test_prefers_then_falls_back_with_a_reason():
    policy = ExamplePlacement(headroom=1.0)
    assert policy.choose("reward", "a", ["a", "b"], {"a": 3.0, "b": 1.0}, 1.0)[0] == "a"
    pool, why = policy.choose("reward", "a", ["a", "b", "c"],
                              {"a": 1.0, "b": 2.0, "c": 5.0}, 1.0)
    assert pool == "c" and "most room" in why
    assert policy.choose("reward", "a", ["a"], {"a": 1.0}, 1.0)[0] is None


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("placement", "example")
    assert desc.create({"headroom": 2.0}).headroom == 2.0
