"""Run configuration: YAML with line numbers, overrides, validation messages."""

from __future__ import annotations

import pytest

from rollart_sdk.config import LineMap, load_config, parse_override
from rollart_sdk.errors import ConfigError

BASE = """\
name: t
model:
  tiny: {hidden_size: 32}
pools:
  - {name: H800, hardware: H800, kind: gpu, profile: compute, count: 2}
  - {name: cpu, hardware: cpu, kind: cpu, count: 8}
tasks:
  - tag: FrozenLake
    env: {name: frozenlake}
    affinity: H800
    max_turns: 4
rollout:
  batch_size: 8
  group_size: 4
  alpha: 1
"""


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_loads_and_applies_overrides(tmp_path):
    cfg, lines = load_config(write(tmp_path, BASE), ["rollout.alpha=2", "tasks.0.max_turns=6", "rollout.mode=sync"])
    assert cfg.rollout.alpha == 2 and cfg.rollout.mode == "sync"
    assert cfg.task("FrozenLake").max_turns == 6
    assert cfg.pool("H800").profile == "compute" and cfg.pool("cpu").profile == "cpu"
    assert lines.line_of("rollout.alpha") == 15


def test_overrides_leave_the_callers_data_as_it_was():
    import copy

    import yaml

    data = yaml.safe_load(BASE)
    before = copy.deepcopy(data)
    cfg, _ = load_config(data=data, overrides=["rollout.alpha=2", "train.steps=7"])
    assert (cfg.rollout.alpha, cfg.train.steps) == (2, 7)
    assert data == before  # the same dict can start the next run without them


def test_malformed_yaml_names_line(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, BASE + "train:\n  steps: [1, 2\n"))
    assert "line 17" in str(exc.value) and "malformed YAML" in str(exc.value)


def test_wrong_type_names_key_and_line(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, BASE.replace("alpha: 1", "alpha: lots")))
    msg = str(exc.value)
    assert "rollout.alpha (line 15)" in msg and "'lots'" in msg


def test_unknown_key_and_bad_literal(tmp_path):
    text = BASE.replace("alpha: 1", "alpha: 1\n  mdoe: async\n  mode: fast")
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, text))
    msg = str(exc.value)
    assert "rollout.mdoe (line 16): unknown key" in msg
    assert "rollout.mode (line 17)" in msg and "'sync', 'one_off' or 'async'" in msg


def test_cross_references_checked(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, BASE.replace("affinity: H800", "affinity: H100")))
    assert "tasks.0.affinity (line 10): no pool named 'H100'; pools: H800, cpu" in str(exc.value)


def test_batch_must_hold_whole_groups(tmp_path):
    with pytest.raises(ConfigError, match="multiple of group_size"):
        load_config(write(tmp_path, BASE), ["rollout.batch_size=6"])


def test_model_needs_exactly_one_source(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of model.path"):
        load_config(write(tmp_path, BASE), ["model.path=/x"])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override("rollout.alpha")
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])


def test_override_bad_list_index(tmp_path):
    with pytest.raises(ConfigError, match="list index must be 0..0"):
        load_config(write(tmp_path, BASE), ["tasks.3.max_turns=2"])
    with pytest.raises(ConfigError, match="list index must be 0..0"):
        load_config(write(tmp_path, BASE), ["tasks[3].max_turns=2"])


def test_a_list_item_is_written_either_way(tmp_path):
    # tasks[0].x as the docs write tasks[].x, or tasks.0.x: the same override.
    a, _ = load_config(write(tmp_path, BASE), ["tasks[0].max_turns=7"])
    b, _ = load_config(write(tmp_path, BASE), ["tasks.0.max_turns=7"])
    assert a.tasks[0].max_turns == b.tasks[0].max_turns == 7
    assert parse_override("a[1][2].b=3") == (["a", "1", "2", "b"], 3)


def test_linemap_falls_back_to_parent():
    lm = LineMap.from_yaml("a:\n  b:\n    c: 1\n")
    assert lm.line_of("a.b.c") == 3 and lm.line_of("a.b.zz") == 2


def test_gguf_package_path_resolution():
    from rollart_sdk.config import ModelConfig

    m = ModelConfig(gguf="package:no_such_pkg_abc/x.gguf")
    with pytest.raises(ConfigError, match="not installed"):
        m.gguf_path()


def test_async_alpha_zero_is_valid_and_batched_needs_iterations(tmp_path):
    cfg, _ = load_config(write(tmp_path, BASE), ["rollout.alpha=0", "rollout.mode=async"])
    assert cfg.rollout.effective_alpha == 0
    cfg, _ = load_config(write(tmp_path, BASE), ["rollout.alpha=3", "rollout.mode=one_off"])
    assert cfg.rollout.effective_alpha == 0  # one_off: started under the serving version
    with pytest.raises(ConfigError, match="interaction: batched"):
        load_config(write(tmp_path, BASE), ["rollout.interaction=batched", "rollout.mode=async"])
    cfg, _ = load_config(write(tmp_path, BASE), ["rollout.interaction=batched", "rollout.mode=sync"])
    assert cfg.rollout.interaction == "batched"


def test_top_k_and_top_p_on_a_trained_task_are_warned_about(tmp_path):
    from rollart_sdk.job.preflight import sampling_warnings

    cfg, _ = load_config(write(tmp_path, BASE))
    assert sampling_warnings(cfg) == []
    cfg, _ = load_config(write(tmp_path, BASE), ["tasks.0.sampling.top_p=0.9"])
    (w,) = sampling_warnings(cfg)
    assert w.startswith("tasks.0.sampling: top_k=0, top_p=0.9") and "top_p: 1.0" in w
    cfg, _ = load_config(write(tmp_path, BASE), ["tasks.0.sampling.top_k=5",
                                                 "tasks.0.sampling.temperature=0"])
    assert sampling_warnings(cfg) == []  # greedy: nothing is sampled (evaluation)
