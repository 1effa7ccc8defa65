"""``rollart bench weights`` at tiny sizes through the CLI: the rows it promises.

No speed thresholds: the checks are that a pipeline row comes from a real run (its version
bytes are the tiny model's, every update after the baseline counted) and that the hidden
fraction is the documented formula of the reported times' run, within [0, 1].
"""

from __future__ import annotations

import json

import pytest

from rollart_sdk.cli import main


def test_weights_bench_rows(tmp_path):
    out = tmp_path / "weights.json"
    rc = main(["bench", "weights", "--transports", "local", "--models", "tiny", "--steps",
               "4", "--transfer-mb", "2", "--defer", "on,off", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    deferred, eager, transfer = result["rows"]
    for row in (deferred, eager, transfer):
        for key in ("transport", "model_mb", "transfer_s", "exposed_s", "hidden_fraction",
                    "gbps", "load"):
            assert key in row, key
    assert (deferred["defer"], eager["defer"]) == (True, False)
    for row in (deferred, eager):
        assert row["kind"] == "pipeline" and row["transport"] == "local"
        assert row["steps"] == 4
        assert 0.3 < row["model_mb"] < 0.5  # the quickstart's tiny model, float32
        assert row["baseline_s"] > 0 and row["exposed_s"] > 0
        # hidden_fraction = 1 - exposed / baseline per update (clipped at 0), medians over
        # the updates after the baseline: with an odd count the relation holds for the
        # medians; with an even one (the mean of two) the clipped mean is not below it.
        expected = max(0.0, 1 - row["exposed_s"] / row["baseline_s"])
        tol = 1e-3 + 1e-4 / row["baseline_s"]  # the times are rounded to 0.1 ms
        if row["updates"] % 2:
            assert row["hidden_fraction"] == pytest.approx(expected, abs=tol), row
        else:
            assert row["hidden_fraction"] >= expected - tol, row
        assert row["exposed_s"] >= row["wait_s"] >= 0
    # A swap at every suspend point: updates 1 (the baseline), 2 and 3.
    assert eager["updates"] == 2 and eager["deferred"] == 0
    # Deferred: a version not yet arrived at its suspend point is swapped at the next one
    # (2 when nothing was deferred, 1 when version 3 was still arriving at the last one).
    assert deferred["updates"] in (1, 2)
    assert deferred["updates"] + deferred["deferred"] >= 2
    assert transfer["kind"] == "transfer" and abs(transfer["model_mb"] - 2) < 0.01
    assert transfer["transfer_s"] > 0 and transfer["gbps"] > 0


def test_weights_bench_lora_row(tmp_path):
    """A ``*-lora`` model: the same quickstart run training LoRA adapters through the real
    pipeline; a version is the adapter payload, a fraction of the model's 0.3-0.5 MB."""
    out = tmp_path / "weights.json"
    rc = main(["bench", "weights", "--transports", "local", "--models", "tiny-lora",
               "--steps", "3", "--transfer-mb", "0", "--json", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "tiny-lora" and row["steps"] == 3
    assert 0 < row["model_mb"] < 0.1
    assert row["baseline_s"] > 0
    # Figures of the updates after the baseline one; an update that was wholly hidden
    # (exposed 0) does not count, so a short run can have none (then no figure).
    assert (row["exposed_s"] is None) == (row["updates"] == 0)
    assert row["exposed_s"] is None or row["exposed_s"] > 0
