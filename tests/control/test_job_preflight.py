"""`build_job` refuses a bad config before any worker starts, and builds each env once.

Each refusal below used to be raised after the workers (Ray actors, or in-process
workers) had started: an env pool smaller than a group and a prefill-decode engine
without K/V hand-off while wiring the control plane, ``constrain_actions`` on an env
without action words while building the task runtimes. A spy on the spawners records
every worker cluster started; a refused config leaves it empty, and leaves no run
directory. The envs are the real plugins (frozenlake, arithmetic), counted as they are
constructed."""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace

import pytest
from control_configs import two_tasks

from rollart_sdk.config import load_config
from rollart_sdk.errors import ConfigError
from rollart_sdk.job import build_job
from rollart_sdk.plugins import get_plugins, load_plugins

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def started(monkeypatch):
    """Every worker cluster a spawner starts (``"train"``, ``"gen"``, ...), and ``"ray"``
    when a Ray spawner is made (refused here: these tests start no Ray)."""
    from rollart_sdk.cluster import spawn

    names: list[str] = []
    real = spawn.LocalSpawner.cluster

    def cluster(self, cls, name, *args, **kwargs):
        names.append(name)
        return real(self, cls, name, *args, **kwargs)

    def ray_spawner(self, *args, **kwargs):
        names.append("ray")
        raise AssertionError("a Ray spawner was made for a config that must be refused")

    monkeypatch.setattr(spawn.LocalSpawner, "cluster", cluster)
    monkeypatch.setattr(spawn.RaySpawner, "__init__", ray_spawner)
    return names


def _refused(tmp_path, data, started, match, registry=None, in_process=True):
    out = tmp_path / "runs"
    cfg, lines = load_config(data=data, overrides=[f"output_dir={out}"])
    with pytest.raises(ConfigError, match=match) as info:
        build_job(cfg, lines, in_process=in_process, log=lambda *a: None, registry=registry)
    assert started == []  # no worker, in process or on Ray
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]
    return str(info.value)


@pytest.mark.parametrize("in_process", [True, False])
def test_env_pool_smaller_than_a_group_is_refused_before_any_worker(tmp_path, started,
                                                                   in_process):
    data = two_tasks()
    data["tasks"][1]["env_pool"] = 2  # rollout.group_size is 4
    if not in_process:
        data["transport"] = {"name": "ray"}
    text = _refused(tmp_path, data, started, "tasks.1.env_pool", in_process=in_process)
    assert "2 environments cannot run a group of 4" in text


def test_constrain_actions_without_action_words_is_refused_before_any_worker(tmp_path,
                                                                             started):
    data = two_tasks()
    data["tasks"][1]["constrain_actions"] = True  # arithmetic, no answer_tokens: no words
    text = _refused(tmp_path, data, started, "tasks.1.constrain_actions")
    assert "env 'arithmetic' has no action_vocabulary" in text


ENGINE = '''
class NoHandOffEngine:
    """An engine without prefill_kv; a refused run never builds it."""

    def __init__(self, **kwargs):
        raise AssertionError("built for a config that must be refused")
'''


def test_pd_with_an_engine_without_kv_hand_off_is_refused_before_any_worker(
        tmp_path, started, monkeypatch):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "rollart_nohandoff.py").write_text(ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.delitem(sys.modules, "rollart_nohandoff", raising=False)
    from rollart_sdk import hookimpl

    def rollart_register_engines(registry):
        registry.register("nohandoff", factory="rollart_nohandoff:NoHandOffEngine",
                          options="rollart_engine_torch.options:TorchEngineOptions")

    registry = load_plugins(strict=True, extra={"nohandoff": SimpleNamespace(
        rollart_register_engines=hookimpl(rollart_register_engines))}).registry
    data = two_tasks(engine={"name": "nohandoff"},
                     roles={"actor_gen": {"prefill": {"workers": 1}, "decode": {"workers": 1}}})
    text = _refused(tmp_path, data, started, "roles.actor_gen.prefill", registry=registry)
    assert "engine 'nohandoff' cannot hand K/V over" in text


def test_each_env_is_built_once_in_the_driver_before_the_run(tmp_path, started, monkeypatch):
    """Preflight builds each task's env once (its facts and its first observation from
    one instance); spawning and wiring build none (pooled envs are built when a
    trajectory first needs one)."""
    built: Counter[str] = Counter()
    registry = get_plugins().registry
    for name in ("frozenlake", "arithmetic"):
        cls = registry.get("env", name).load()
        real = cls.__init__

        def counting(self, *args, _real=real, _name=name, **kwargs):
            built[_name] += 1
            _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    cfg, lines = load_config(data=two_tasks(), overrides=[f"output_dir={tmp_path}"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        assert built == {"frozenlake": 1, "arithmetic": 1}
        assert started.count("train") == 1 and started.count("gen") == 1  # the spy sees
    finally:
        job.run_dir.close()
        job.close()


def test_the_old_names_of_job_py_still_import_and_agree(tmp_path):
    """`rollart_sdk/job.py`'s names stay importable for one release (sim/job.py, the
    serverless reward's bench, plugins); the old ``_task_runtimes(cfg, described,
    tokenizer)`` gives the runtimes preflight's result gives."""
    from rollart_sdk.config.resolve import resolve_run
    from rollart_sdk.job import (  # noqa: F401 - each name is the check
        ENGINE_MAX_RESTARTS,
        ResumePoint,
        _engine_stats,
        _engine_versions,
        _free_port,
        _spawn_workers,
        _task_runtimes,
        _wire_control_plane,
        _Workers,
        env_summary,
        newest_checkpoint,
        plain,
        run_job,
        task_runtimes,
    )
    from rollart_sdk.job.preflight import preflight
    from rollart_sdk.layout import inprocess_config

    cfg, lines = load_config(data=two_tasks(), overrides=[f"output_dir={tmp_path}"])
    resolved = resolve_run(inprocess_config(cfg), get_plugins().registry, lines,
                           in_process=True)
    checked = preflight(cfg, resolved, lines, log=lambda *a: None)
    new = task_runtimes(cfg, checked)
    old = _task_runtimes(cfg, checked.described, checked.tokenizer)
    assert new["FrozenLake"].allowed_token_ids  # constrain_actions: the four action words
    for tag in ("FrozenLake", "Arithmetic"):
        assert (old[tag].system_prompt, old[tag].allowed_token_ids) == \
            (new[tag].system_prompt, new[tag].allowed_token_ids)
