"""The `rollart` CLI as users meet it: validate and plugins, with broken plugins around."""

from __future__ import annotations

import json
import re
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[1]
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
            "sim, torch, vllm") in bad.stderr
    assert "No installed plugin provides it" in bad.stderr


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
    # The bad value came from the command line: the error says so, not the key's YAML line.
    assert res.returncode == 2
    assert "rollout.alpha (from the command line: rollout.alpha=-1)" in res.stderr
    assert "line 8" not in res.stderr
    # Backend options are validated by the backend's own model, every problem at once.
    res = run_cli("validate", str(cfg), "engine.options.max_runing=3",
                  "engine.options.max_running=0")
    assert res.returncode == 2
    assert f"invalid configuration in {cfg}" in res.stderr
    assert ("engine.options.max_runing (from the command line: engine.options.max_runing=3): "
            "unknown key; allowed keys:") in res.stderr
    assert "engine.options.max_running (from the command line: engine.options.max_running=0)" in res.stderr
    # A bad value in the file still cites its line.
    bad = write(tmp_path, CONFIG.replace("{engine}", "torch").replace("group_size: 2", "group_size: 0"))
    res = run_cli("validate", str(bad), "rollout.alpha=2")
    assert res.returncode == 2 and "rollout.group_size (line 8)" in res.stderr
    assert "command line" not in res.stderr


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
    assert "failed to import: ImportError: needs a GPU library" in table.stdout
    strict = run_cli("plugins", env={"ROLLART_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2 and "needs a GPU library" in strict.stderr


def test_unknown_benchmark_lists_available():
    res = run_cli("bench", "asynk")
    assert res.returncode == 2
    assert "did you mean 'async'" in res.stderr
    listing = run_cli("bench")
    assert listing.returncode == 0 and "engine" in listing.stdout
    installed = [line.split()[0] for line in listing.stdout.splitlines()[1:] if line.strip()]
    assert {"dispatch", "engine", "straggler", "async"} <= set(installed)
    # Every installed name when few (the core install), else the closest and where to
    # see them all (a heavy install registers more than 12).
    if len(installed) <= 12:
        assert all(name in res.stderr for name in installed)
    else:
        assert f"{len(installed) - 5} more: `rollart bench`" in res.stderr


def test_bench_says_which_package_has_the_sdks_benchmarks_when_it_is_missing():
    """The SDK's benchmarks are the first-party package rollart-benchmark-suite: without it
    (disabled here; in the core's own tests it is installed) `rollart bench` lists the
    other benchmarks and names the missing ones and why, and running one says the same."""
    from rollart_sdk.registry import install_hint

    env = {"ROLLART_DISABLE_PLUGINS": "rollart-benchmark-suite"}
    listing = run_cli("bench", env=env)
    out = " ".join(listing.stdout.split())
    assert listing.returncode == 0 and "engine " in out and "straggler " not in out
    assert ("not available: async, calibration, dispatch, driver, gateway, paper, small, "
            "soak, straggler, turns, weights (the SDK's benchmarks). It is provided by "
            "rollart-benchmark-suite, which is installed but disabled") in out
    res = run_cli("bench", "small", env=env)
    assert res.returncode == 2
    assert "It is provided by rollart-benchmark-suite, which is installed but disabled" in res.stderr
    # The paper's experiments are the suite's benchmark `paper`: `rollart sim` says the same.
    sim = run_cli("sim", "--experiment", "straggler", "--quick", env=env)
    assert sim.returncode == 2, sim.stdout + sim.stderr
    err = " ".join(sim.stderr.split())
    assert "the paper's experiments come with the benchmark suite" in err
    assert "rollart-benchmark-suite, which is installed but disabled" in err
    # Not installed at all: what to pip install, and where it is in this repository.
    assert install_hint("benchmark", "small") == (
        "It is provided by rollart-benchmark-suite, which is not installed: pip install "
        "rollart-benchmark-suite (plugins/benchmarks/rollart-benchmark-suite in the "
        "rollart-sdk repository).")
    full = " ".join(run_cli("bench").stdout.split())
    assert "straggler " in full and "not available" not in full


def test_validate_suggests_close_names():
    res = run_cli("validate", "examples/quickstart.yaml", "tasks.0.env.name=frozenlak",
                  cwd=ROOT)
    assert res.returncode == 2
    assert "unknown env 'frozenlak'; did you mean 'frozenlake'?" in res.stderr


def test_conflict_is_listed_on_both_rows_and_exits_0(fake_site, tmp_path):
    make_dist(fake_site, "rollart-env-one", "env_one_plugin", CLAIMS_FROZENLAKE)
    make_dist(fake_site, "rollart-env-two", "env_two_plugin", CLAIMS_FROZENLAKE)
    res = run_cli("plugins", "--json")
    assert res.returncode == 0, res.stderr
    recs = {r["name"]: r for r in json.loads(res.stdout)}
    for name in ("rollart-env-one", "rollart-env-two", "rollart-env-frozenlake"):
        assert recs[name]["status"].startswith("conflict: env 'frozenlake' is registered")
    assert run_cli("plugins").returncode == 0
    assert run_cli("plugins", "--strict").returncode == 1
    # A run that selects the name fails naming both; one that does not is fine.
    cfg = write(tmp_path, CONFIG.replace("{engine}", "torch"))
    bad = run_cli("validate", str(cfg))
    assert bad.returncode == 2 and "registered twice" in bad.stderr
    ok = run_cli("validate", str(cfg), "tasks.0.env.name=arithmetic")
    assert ok.returncode == 0, ok.stderr


def test_exact_words_disabled_broken_not_installed(fake_site, tmp_path):
    cfg = write(tmp_path, CONFIG.replace("{engine}", "torch"))
    disabled = run_cli("validate", str(cfg),
                       env={"ROLLART_DISABLE_PLUGINS": "rollart-env-frozenlake"})
    assert disabled.returncode == 2
    assert ("provided by rollart-env-frozenlake, which is installed but disabled "
            "(ROLLART_DISABLE_PLUGINS)") in disabled.stderr
    typo = run_cli("plugins", env={"ROLLART_DISABLE_PLUGINS": "rollart-env-frozenlak"})
    assert typo.returncode == 0
    assert "'rollart-env-frozenlak', which is no installed plugin" in typo.stderr
    assert "did you mean 'rollart-env-frozenlake'?" in typo.stderr
    make_dist(fake_site, "rollart-engine-broken", "broken_engine_plugin", BROKEN)
    res = run_cli("validate", str(cfg), "engine.name=broken")
    assert res.returncode == 2
    assert ("Plugin 'rollart-engine-broken' may provide it; it is installed but failed to "
            "import: ImportError: needs a GPU library") in res.stderr
    res = run_cli("validate", str(cfg), "trainer.name=tourch")
    assert "did you mean 'torch'?" in res.stderr


def test_validate_resolves_registered_paths(fake_site, tmp_path):
    make_dist(fake_site, "rollart-env-typos", "typo_env_plugin", TYPO_PATHS)
    cfg = write(tmp_path, CONFIG.replace("{engine}", "torch"))
    res = run_cli("validate", str(cfg), "tasks.0.env.name=typo")
    assert res.returncode == 2, res.stdout
    assert "factory path 'rollart_env_frozenlake.env:FrozenLakeTxtEnv' does not resolve" in res.stderr
    assert "defines no 'FrozenLakeTxtEnv'" in res.stderr
    assert "options model 'rollart_env_frozenlake.envv:FrozenLakeOptions' cannot be imported" in res.stderr
    assert "Traceback" not in res.stderr


def test_validate_refuses_local_transport_in_a_ray_run(tmp_path):
    cfg = write(tmp_path, CONFIG.replace("{engine}", "torch"))
    res = run_cli("validate", str(cfg), "transport.name=local", "layout=ray")
    assert res.returncode == 2
    assert "transport 'local' works only inside one process" in res.stderr
    assert "choose a cross-process transport (installed: " in res.stderr and "ray" in res.stderr
    assert "or run every worker in one process (layout: inprocess)" in res.stderr
    # layout auto: this one-machine run is in process, where the local transport works
    ok = run_cli("validate", str(cfg), "transport.name=local")
    assert ok.returncode == 0, ok.stderr
    assert "layout: inprocess (auto: one machine" in ok.stdout
    assert "transport: local" in ok.stdout


def test_plugins_kind_and_options():
    res = run_cli("plugins", "--kind", "benchmark")
    assert res.returncode == 0
    out = " ".join(res.stdout.split())
    assert "env: frozenlake" not in out
    assert re.search(r"benchmark: dispatch, straggler,[a-z, ]*driver", out), out
    opts = run_cli("plugins", "--options", "frozenlake")
    assert opts.returncode == 0, opts.stderr
    assert "env 'frozenlake' options" in opts.stdout and "obs_format" in opts.stdout
    both = run_cli("plugins", "--options", "torch")
    assert both.returncode == 2 and "--options engine:torch or --options trainer:torch" in both.stderr
    assert "micro_batch_size" in run_cli("plugins", "--options", "trainer:torch").stdout
    miss = run_cli("plugins", "--options", "frozenlak")
    assert miss.returncode == 2 and "did you mean 'frozenlake'" in miss.stderr


def test_hook_tracing_prints_registrations():
    res = run_cli("plugins", "--json", env={"ROLLART_TRACE_HOOKS": "1"})
    assert res.returncode == 0
    assert ("rollart hook: rollart_register_envs -> plugin rollart-env-frozenlake registered "
            "1 env(s): frozenlake") in res.stderr
    assert "rollart_register_envs [hook]" in res.stderr  # pluggy's own tracing, via pm.hook


CLAIMS_FROZENLAKE = """
from rollart_sdk import hookimpl

@hookimpl
def rollart_register_envs(registry):
    registry.register("frozenlake", factory="rollart_env_frozenlake.env:FrozenLakeTextEnv")
"""

TYPO_PATHS = """
from rollart_sdk import hookimpl

@hookimpl
def rollart_register_envs(registry):
    registry.register("typo", factory="rollart_env_frozenlake.env:FrozenLakeTxtEnv",
                      options="rollart_env_frozenlake.envv:FrozenLakeOptions")
"""


def test_status_never_hangs_on_a_dead_address():
    res = run_cli("status", "--address", "127.0.0.1:9", "--timeout", "20")
    assert res.returncode == 2
    assert "127.0.0.1:9" in res.stderr and "Traceback" not in res.stderr


def test_worker_output_is_quiet_unless_asked():
    code = ("import os; from rollart_sdk.ray_utils import local_ray_env; local_ray_env(); "
            "print(os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'), "
            "os.environ.get('RAY_COLOR_PREFIX'))")
    import subprocess
    import sys

    clean = {k: v for k, v in __import__("os").environ.items()
             if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "RAY_COLOR_PREFIX", "ROLLART_VERBOSE")}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=clean, timeout=60)
    assert quiet.stdout.split() == ["1", "0"]  # no progress bars; not a tty: no ANSI colours
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**clean, "ROLLART_VERBOSE": "1"}, timeout=60)
    assert loud.stdout.split() == ["None", "0"]


def test_bench_engine_option_selects_the_engine_benchmark():
    """`rollart bench engine --engine vllm` runs the vLLM plugin's benchmark (its parser
    rejects a bad option before anything heavy is imported); plain `bench engine` is the
    torch engine's, which has no --sides."""
    res = run_cli("bench", "engine", "--engine", "vllm", "--sides", "nope")
    assert res.returncode == 2
    assert "rollart bench engine --engine vllm: error: argument --sides" in res.stderr
    res = run_cli("bench", "engine", "--sides", "vllm")
    assert res.returncode == 2 and "unrecognized arguments: --sides" in res.stderr


def test_the_step_line_names_rewards_and_success_rates():
    from rollart_sdk.control.progress import step_scores

    m = {"step": 3, "reward/Arithmetic": 0.688, "success/Arithmetic": 0.0,
         "reward/FrozenLake": 0.042, "success/FrozenLake": 0.042, "staleness/max": 1}
    assert step_scores(m) == ("reward Arithmetic=0.69 FrozenLake=0.04  "
                              "success Arithmetic=0.00 FrozenLake=0.04")
    assert step_scores({"reward/Echo": 1.0}) == "reward Echo=1.00"  # no success reported


def test_a_task_dump_shows_where_its_coroutine_waits():
    """SIGUSR1's asyncio part: a suspended task's whole await chain, outermost first
    (``Task.print_stack`` shows only its outermost frame: every run's ``_main``)."""
    import asyncio

    from rollart_sdk.cli import await_chain

    async def inner() -> None:
        await asyncio.sleep(10)

    async def middle() -> None:
        await inner()

    async def main() -> list:
        task = asyncio.create_task(middle())
        await asyncio.sleep(0.01)
        chain = await_chain(task.get_coro())
        task.cancel()
        return chain

    chain = asyncio.run(main())
    assert [name for _, _, name in chain] == ["middle", "inner", "sleep"]
    assert chain[0][0] == __file__ and chain[-1][0].endswith("asyncio/tasks.py")
