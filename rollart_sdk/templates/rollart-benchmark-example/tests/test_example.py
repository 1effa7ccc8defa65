import json

import pytest
import rollart_benchmark_example.plugin as plugin
from rollart_benchmark_example.bench import ExampleBench


def test_runs_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    assert ExampleBench(["--size", "100", "--repeats", "2", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())) == {"copy (baseline)", "sorted"}


def test_has_its_own_help(capsys):
    with pytest.raises(SystemExit):
        ExampleBench(["--help"])
    assert "--repeats" in capsys.readouterr().out


def test_registers(register_plugin):
    assert register_plugin(plugin).registry.get("benchmark", "example").load() is ExampleBench
