"""``rollart bench weights`` at tiny sizes through the CLI: the rows it promises.

No speed thresholds: the checks are that a pipeline row comes from a real run (its version
bytes are the tiny model's, every update after the baseline counted) and that the hidden
fraction is the documented formula of the reported times' run, within [0, 1].
"""

from __future__ import annotations

import json

from rollart_sdk.cli import main


def test_weights_bench_rows(tmp_path):
    out = tmp_path / "weights.json"
    rc = main(["bench", "weights", "--transports", "local", "--models", "tiny", "--steps",
               "3", "--transfer-mb", "2", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    pipeline, transfer = result["rows"]
    for row in (pipeline, transfer):
        for key in ("transport", "model_mb", "transfer_s", "exposed_s", "hidden_fraction",
                    "gbps"):
            assert key in row, key
    assert pipeline["kind"] == "pipeline" and pipeline["transport"] == "local"
    assert pipeline["steps"] == 3 and pipeline["updates"] == 1  # updates 2 and 3; 2 is baseline
    assert 0.3 < pipeline["model_mb"] < 0.5  # the quickstart's tiny model, float32
    assert pipeline["baseline_s"] > 0 and pipeline["exposed_s"] > 0
    assert 0.0 <= pipeline["hidden_fraction"] <= 1.0
    assert transfer["kind"] == "transfer" and abs(transfer["model_mb"] - 2) < 0.01
    assert transfer["transfer_s"] > 0 and transfer["gbps"] > 0
