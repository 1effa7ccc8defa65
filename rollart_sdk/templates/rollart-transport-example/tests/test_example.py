import rollart_transport_example.plugin as plugin
from rollart_transport_example.transport import ExampleTransport

from rollart_sdk.testing.transport import check_transport


def test_conforms():
    summary = check_transport(lambda: ExampleTransport(role="sender", channel="kit"),
                              lambda: ExampleTransport(role="receiver", channel="kit"), name="example")
    assert summary["corrupt_rejected"]


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("transport", "example")
    assert desc.create({"channel": "x"}, role="sender").channel == "x"
