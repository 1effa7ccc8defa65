"""rollart-sink-tensorboard: the conformance kit's steps, read back with TensorBoard's
EventAccumulator."""

from __future__ import annotations

import pytest
from rollart_sink_tensorboard import TensorBoardSink
from rollart_sink_tensorboard.read import read_scalars, read_texts

from rollart_sdk.testing.sink import check_sink


def test_every_step_config_and_samples_read_back(tmp_path):
    sent = check_sink(TensorBoardSink, tmp_path, flush_secs=1)
    scalars = read_scalars(tmp_path / "tensorboard")
    assert set(scalars) == set(sent["metrics"])
    for key, rows in sent["metrics"].items():
        assert [s for s, _ in scalars[key]] == [s for s, _ in rows]
        assert [v for _, v in scalars[key]] == pytest.approx([v for _, v in rows])
    texts = read_texts(tmp_path / "tensorboard")
    assert "batch_size: 8" in texts["config"][0][1]
    ((step, text),) = texts["samples/Arithmetic"]
    assert step == 3 and "2+2=" in text and "env_step: boom" in text


def test_samples_can_be_turned_off(tmp_path):
    check_sink(TensorBoardSink, tmp_path, samples=False)
    assert "samples/Arithmetic" not in read_texts(tmp_path / "tensorboard")
