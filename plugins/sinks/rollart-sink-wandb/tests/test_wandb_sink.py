"""rollart-sink-wandb: the conformance kit's steps in offline mode, read back from the
offline run's transaction log (records decoded by wandb's own protobuf messages)."""

from __future__ import annotations

import pytest
from rollart_sink_wandb import WandbSink
from rollart_sink_wandb.read import offline_runs, read_run

from rollart_sdk.testing.sink import check_sink

pytestmark = pytest.mark.timeout(300)


def test_every_step_config_and_samples_table_read_back(tmp_path):
    sent = check_sink(WandbSink, tmp_path)
    (folder,) = offline_runs(tmp_path)
    run = read_run(folder)
    for key, rows in sent["metrics"].items():
        got = [(s, row[key]) for s, row in sorted(run["history"].items()) if key in row]
        assert got == pytest.approx(rows), (key, run["history"])
    assert run["config"]["rollout"] == {"batch_size": 8, "mode": "async"}
    last = run["history"][3]
    assert last.get("samples/_type") == "table-file" and last.get("samples/nrows") == 2
