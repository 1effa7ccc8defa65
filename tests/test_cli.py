"""The `rollart` CLI as users meet it: validate and plugins, with broken plugins around."""

from __future__ import annotations

import json

from rollart_sdk.testing.dists import make_dist, run_cli

CONFIG = """\
model:
  tiny: {hidden_size: 32}
tasks:
  - tag: FrozenLake
    env: {name: frozenlake}
engine:
  name: {engine}
rollout: {batch_size: 4, group_size: 2}
"""

BROKEN = "raise ImportError('needs a GPU library that is not installed')\n"


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_validate_ok_and_unknown_engine_names_installed(tmp_path):
    ok = run_cli("validate", str(write(tmp_path, CONFIG.replace("{engine}", "torch"))))
    assert ok.returncode == 0, ok.stderr
    assert "engine: torch" in ok.stdout
    bad = run_cli("validate", str(write(tmp_path, CONFIG.replace("{engine}", "tensorrt"))))
    assert bad.returncode == 2
    assert ("engine.name (line 7): unknown engine 'tensorrt'; installed engines: sglang, "
            "torch, vllm") in bad.stderr
    assert "Install the plugin that provides it" in bad.stderr


def test_validate_vllm_engine_without_vllm_installed(tmp_path):
    """Registration is light: a vLLM config validates where vLLM is not installed, and an
    impossible option combination is reported at validate time."""
    cfg = write(tmp_path, CONFIG.replace("{engine}", "vllm"))
    ok = run_cli("validate", str(cfg))
    assert ok.returncode == 0, ok.stderr
    assert "engine: vllm (rollart-engine-vllm)" in ok.stdout
    res = run_cli("validate", str(cfg), "engine.options.device=cpu",
                  "engine.options.gpu_memory_utilization=0.5")
    assert res.returncode == 2
    assert "gpu_memory_utilization is a GPU option" in res.stderr


def test_validate_bad_options_and_override(tmp_path):
    cfg = write(tmp_path, CONFIG.replace("{engine}", "torch"))
    res = run_cli("validate", str(cfg), "rollout.alpha=-1")
    assert res.returncode == 2 and "rollout.alpha (line 8)" in res.stderr
    # Backend options are validated by the backend's own model, every problem at once.
    res = run_cli("validate", str(cfg), "engine.options.max_runing=3",
                  "engine.options.max_running=0")
    assert res.returncode == 2
    assert f"invalid configuration in {cfg}" in res.stderr
    assert "engine.options.max_runing (line 6): unknown key; allowed keys:" in res.stderr
    assert "engine.options.max_running" in res.stderr


def test_malformed_yaml_and_wrong_type_point_at_line(tmp_path):
    res = run_cli("validate", str(write(tmp_path, CONFIG.replace("{engine}", "torch") + "train: [1,\n")))
    assert res.returncode == 2 and "line 10" in res.stderr and "malformed YAML" in res.stderr
    res = run_cli("validate", str(write(tmp_path, CONFIG.replace("{engine}", "torch").replace(
        "batch_size: 4", "batch_size: four"))))
    assert res.returncode == 2
    assert "rollout.batch_size (line 8)" in res.stderr and "'four'" in res.stderr


def test_broken_plugin_does_not_break_commands(fake_site, tmp_path):
    make_dist(fake_site, "rollart-engine-broken", "broken_engine_plugin", BROKEN)
    plugins = run_cli("plugins", "--json")
    assert plugins.returncode == 0, plugins.stderr
    rec = {r["name"]: r for r in json.loads(plugins.stdout)}["rollart-engine-broken"]
    assert "needs a GPU library" in rec["error"]
    table = run_cli("plugins")
    assert table.returncode == 0 and "rollart-engine-broken" in table.stdout
    ok = run_cli("validate", str(write(tmp_path, CONFIG.replace("{engine}", "torch"))))
    assert ok.returncode == 0, ok.stderr
    strict = run_cli("plugins", env={"ROLLART_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2 and "needs a GPU library" in strict.stderr


def test_unknown_benchmark_lists_available():
    res = run_cli("bench", "nope")
    assert res.returncode == 2
    for name in ("dispatch", "engine", "straggler", "async"):
        assert name in res.stderr


def test_bench_engine_option_selects_the_engine_benchmark():
    """`rollart bench engine --engine vllm` runs the vLLM plugin's benchmark (its parser
    rejects a bad option before anything heavy is imported); plain `bench engine` is the
    torch engine's, which has no --sides."""
    res = run_cli("bench", "engine", "--engine", "vllm", "--sides", "nope")
    assert res.returncode == 2
    assert "rollart bench engine --engine vllm: error: argument --sides" in res.stderr
    res = run_cli("bench", "engine", "--sides", "vllm")
    assert res.returncode == 2 and "unrecognized arguments: --sides" in res.stderr
