"""Lets pytest import this package from its folder before it is pip-installed, and gives
the tests an isolated plugin set holding this package's plugin as its entry point loads it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def suite_plugins(register_plugin):
    """Built-ins plus this package's plugin (no other entry point)."""
    import rollart_benchmark_suite.plugin as plugin

    return register_plugin(plugin, name="rollart-benchmark-suite")
