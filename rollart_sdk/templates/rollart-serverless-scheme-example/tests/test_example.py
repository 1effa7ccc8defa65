import rollart_serverless_scheme_example.plugin as plugin
from rollart_serverless_scheme_example.scheme import ExampleCaller

from rollart_sdk.serverless import serve_function


def test_calls_a_served_function():
    with serve_function(lambda a, b=0: a + b) as endpoint:
        url = endpoint.url.replace("http://", "example://")
        assert ExampleCaller(url, timeout_s=10)(2, b=3) == 5


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("serverless_scheme", "example")
    assert desc.load() is ExampleCaller
