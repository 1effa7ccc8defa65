"""Metric sinks (``logging:``) in a real in-process run: TensorBoard, MLflow and W&B
(offline) each get every step's metrics and the config, read back with each library's own
reader and compared with metrics.jsonl; a sink that fails warns once, is counted in
summary.json, and the run goes on."""

from __future__ import annotations

import copy
import json
import math
from types import SimpleNamespace

import pytest
from control_configs import TWO_TASKS

from rollart_sdk.config import load_config
from rollart_sdk.control.sinks import SinkSet, flatten_metrics
from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.job import build_job, run_job
from rollart_sdk.plugins import load_plugins

pytestmark = pytest.mark.timeout(600)


class BrokenSink:
    """Fails on every step (a library bug, a full disk)."""

    calls = 0

    def __init__(self, run_dir: str, run_name: str) -> None:
        pass

    def log_config(self, config):
        pass

    def log_metrics(self, step, metrics):
        BrokenSink.calls += 1
        raise OSError(28, "No space left on device")

    def close(self):
        pass


@hookimpl
def rollart_register_sinks(registry):
    registry.register("broken", factory=BrokenSink, summary="fails every step")


def _registry():
    """The installed plugins, plus this repository's sink plugins when they are not
    installed (a checkout used through PYTHONPATH), plus the broken sink."""
    import rollart_sink_mlflow.plugin
    import rollart_sink_tensorboard.plugin
    import rollart_sink_wandb.plugin

    installed = load_plugins().registry.names("sink")
    extra: dict = {"test-broken-sink": SimpleNamespace(
        rollart_register_sinks=rollart_register_sinks)}
    for name, module in [("tensorboard", rollart_sink_tensorboard.plugin),
                         ("mlflow", rollart_sink_mlflow.plugin),
                         ("wandb", rollart_sink_wandb.plugin)]:
        if name not in installed:
            extra[f"rollart-sink-{name}"] = module
    return load_plugins(extra=extra).registry


@pytest.fixture(scope="module")
def sink_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sinks")
    data = copy.deepcopy(TWO_TASKS)
    data["logging"] = [{"name": "tensorboard"}, {"name": "mlflow"}, {"name": "wandb"},
                       {"name": "broken"}]
    cfg, lines = load_config(data=data, overrides=[f"output_dir={tmp}"])
    warnings: list[str] = []
    job = build_job(cfg, lines, in_process=True, log=warnings.append, registry=_registry())
    try:
        run_job(job, 3, progress=False)
    finally:
        job.close()
    path = job.run_dir.path
    metrics = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((path / "summary.json").read_text())
    return SimpleNamespace(path=path, metrics=metrics, summary=summary, warnings=warnings,
                           config=cfg.model_dump(mode="json"))


def _expected(metrics):
    """metric key -> [(step, value)] as every sink should hold it."""
    out: dict[str, list] = {}
    for line in metrics:
        for key, value in flatten_metrics(line).items():
            out.setdefault(key, []).append((line["step"], value))
    return out


def _same(got, want, what):
    assert set(got) >= set(want), f"{what} lacks {sorted(set(want) - set(got))[:5]}"
    for key, rows in want.items():
        assert [s for s, _ in got[key]] == [s for s, _ in rows], (what, key)
        for (_, a), (_, b) in zip(got[key], rows, strict=True):
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), (what, key, a, b)


def test_the_run_trains_every_step_and_counts_the_broken_sink(sink_run):
    assert [m["step"] for m in sink_run.metrics] == [1, 2, 3]
    assert sink_run.summary["sinks"]["broken"]["errors"] == 3
    assert "No space left" in sink_run.summary["sinks"]["broken"]["first_error"]
    for name in ("tensorboard", "mlflow", "wandb"):
        assert sink_run.summary["sinks"][name] == {"errors": 0, "first_error": None}
    assert any("metric sinks: tensorboard, mlflow, wandb, broken" in w for w in sink_run.warnings)


def test_tensorboard_holds_every_step(sink_run):
    from rollart_sink_tensorboard.read import read_scalars, read_texts

    want = _expected(sink_run.metrics)
    _same(read_scalars(sink_run.path / "tensorboard"), want, "tensorboard")
    texts = read_texts(sink_run.path / "tensorboard")
    assert "rollout:" in texts["config"][0][1]
    assert {t for t in texts if t.startswith("samples/")} == {"samples/FrozenLake",
                                                             "samples/Arithmetic"}


def test_mlflow_holds_every_step(sink_run):
    from rollart_sink_mlflow.read import read_run
    from rollart_sink_mlflow.sink import metric_key

    run = read_run((sink_run.path / "mlruns").resolve().as_uri())
    want = {metric_key(k, file_store=True): v for k, v in _expected(sink_run.metrics).items()}
    _same(run["metrics"], want, "mlflow")
    assert run["status"] == "FINISHED"
    assert run["params"]["rollout.batch_size"] == "8"
    assert run["name"] == sink_run.path.name


def test_wandb_offline_run_holds_every_step(sink_run):
    from rollart_sink_wandb.read import offline_runs, read_run

    (folder,) = offline_runs(sink_run.path)
    run = read_run(folder)
    got: dict[str, list] = {}
    for step, row in sorted(run["history"].items()):
        for key, value in row.items():
            if isinstance(value, (int, float)) and not key.startswith("_"):
                got.setdefault(key, []).append((step, float(value)))
    _same(got, _expected(sink_run.metrics), "wandb")
    assert run["config"]["rollout"]["batch_size"] == 8
    assert any(row.get("samples", {}).get("_type") == "table-file"
               or row.get("samples/_type") == "table-file" for row in run["history"].values())


def test_a_sink_that_does_not_start_is_left_out():
    class Res:
        descriptor = SimpleNamespace(name="nope")

        def create(self, **kw):
            raise ImportError("no module named 'nope'")

    said: list[str] = []
    sinks = SinkSet.start([Res()], "/nowhere", "r", {}, warn=said.append)  # type: ignore[list-item]
    sinks.step({"step": 1, "x": 1.0})
    assert sinks.sinks == [] and "did not start" in said[0]
    assert sinks.summary()["nope"]["started"] is False


def test_flatten_metrics_keeps_numbers_only():
    got = flatten_metrics({"step": 3, "a": 1, "b": True, "c": None, "d": float("nan"),
                           "e": "text", "staleness/hist": {0: 5, 1: 2}})
    assert got == {"a": 1.0, "b": 1.0, "staleness/hist/0": 5.0, "staleness/hist/1": 2.0}


def test_a_failing_sink_is_said_once_and_counted_every_time():
    class Res:
        descriptor = SimpleNamespace(name="broken")

        def create(self, **kw):
            return BrokenSink(**kw)

    said: list[str] = []
    sinks = SinkSet.start([Res()], "/nowhere", "r", {}, warn=said.append)  # type: ignore[list-item]
    for step in (1, 2, 3):
        sinks.step({"step": step, "x": 1.0})
    sinks.close()
    sinks.close()
    assert len(said) == 1 and "failed in log_metrics" in said[0]
    assert sinks.summary()["broken"]["errors"] == 3


class _NoLib:
    @staticmethod
    @hookimpl
    def rollart_register_sinks(registry):
        registry.register("nolib", factory="rollart_sdk.control.sinks:SinkSet",
                          requires={"rollart_no_such_module_xyz": "pip install xyz-lib"})


def test_a_sink_without_its_library_warns_in_validate_and_stops_train(tmp_path):
    from rollart_sdk.config.resolve import resolve_run
    from rollart_sdk.errors import ConfigError

    data = copy.deepcopy(TWO_TASKS)
    data["logging"] = [{"name": "nolib"}]
    cfg, lines = load_config(data=data, overrides=[f"output_dir={tmp_path / 'runs'}"])
    registry = load_plugins(extra={"nolib": SimpleNamespace(
        rollart_register_sinks=_NoLib.rollart_register_sinks)}).registry
    resolved = resolve_run(cfg, registry, lines, in_process=True)  # validate: a warning
    ((where, why),) = resolved.missing
    assert where == "logging.0.name" and "sink 'nolib' needs" in why and "pip install xyz-lib" in why
    with pytest.raises(ConfigError, match="pip install xyz-lib"):
        build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_logging_names_each_sink_once():
    from rollart_sdk.errors import ConfigError

    data = copy.deepcopy(TWO_TASKS)
    data["logging"] = [{"name": "tensorboard"}, {"name": "tensorboard"}]
    with pytest.raises(ConfigError, match="each sink at most once"):
        load_config(data=data)
