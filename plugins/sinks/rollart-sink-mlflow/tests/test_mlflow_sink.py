"""rollart-sink-mlflow: the conformance kit's steps, read back with MLflow's tracking
client (get_metric_history) from the file store under the run directory."""

from __future__ import annotations

import pytest
from rollart_sink_mlflow import MlflowSink
from rollart_sink_mlflow.read import read_run
from rollart_sink_mlflow.sink import metric_key

from rollart_sdk.testing.sink import check_sink


def test_every_step_and_the_config_read_back(tmp_path):
    sent = check_sink(MlflowSink, tmp_path, experiment="kit", tags={"who": "test"})
    run = read_run((tmp_path / "mlruns").resolve().as_uri(), experiment="kit")
    assert run["status"] == "FINISHED" and run["name"] == sent["run_name"]
    want = {metric_key(k, file_store=True): v for k, v in sent["metrics"].items()}
    assert set(run["metrics"]) == set(want)
    for key, rows in want.items():
        assert [s for s, _ in run["metrics"][key]] == [s for s, _ in rows]
        assert [v for _, v in run["metrics"][key]] == pytest.approx([v for _, v in rows])
    assert run["params"]["rollout.batch_size"] == "8"
    assert run["params"]["tasks.0.tag"] == "Arithmetic"


def test_metric_keys_mlflow_accepts():
    assert metric_key("reward/Arith metic") == "reward/Arith metic"
    assert metric_key("count/a+b") == "count/a_b"
    assert metric_key("env/failures/x", file_store=True) == "env.failures.x"
