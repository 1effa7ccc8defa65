"""``rollart bench gateway`` runs end to end (echo engine, a few calls) and reports both
sides; the registry finds it under its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("aiohttp")

pytestmark = pytest.mark.timeout(300)


def test_bench_gateway_measures_both_sides(tmp_path: Path) -> None:
    from rollart_benchmark_suite.gateway import main

    from rollart_sdk.plugins import get_registry

    assert get_registry().get("benchmark", "gateway").load() is main
    out = tmp_path / "gw.json"
    assert main(["--engine", "echo", "--episodes", "3", "--calls", "2", "--repeats", "1",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    (rep,) = res["repeats"]
    # Every agent's calls went through the gateway, and the same ones to the engine.
    assert rep["gateway"]["calls"] == rep["direct"]["calls"] == 6
    for side in ("gateway", "direct"):
        assert res["median"][side]["rps"] > 0 and res["median"][side]["p50_ms"] > 0
    with pytest.raises(SystemExit):
        main(["--episodes", "0"])
