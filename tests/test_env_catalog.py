"""`rollart envs` (options, turn budget, character) and `rollart plugins` saying why a name
a plugin knows is not registered."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollart_sdk.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_envs_lists_options_turns_and_character():
    done = cli("envs", "--json", "frozenlake", "arithmetic")
    assert done.returncode == 0, done.stderr
    records = {r["name"]: r for r in json.loads(done.stdout)}
    fl = records["frozenlake"]
    assert "prefill-heavy" in fl["character"] and "max_steps" in fl["turns"]
    options = {o["name"]: o for o in fl["options"]}
    assert options["map_name"]["default"] == "4x4" and options["is_slippery"]["default"] is False
    assert "decode-heavy" in records["arithmetic"]["character"]
    table = cli("envs")
    assert table.returncode == 0 and "frozenlake" in table.stdout and "prefill-heavy" in table.stdout


def test_envs_unknown_name_is_a_clear_error():
    done = cli("envs", "no-such-env")
    assert done.returncode == 2 and "unknown env 'no-such-env'" in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("rollart_env_gem") is None,
                    reason="rollart-env-gem is not installed")
def test_plugins_says_why_gem_ids_are_missing():
    done = cli("plugins")
    assert done.returncode == 0, done.stderr
    assert ("rollart-env-gem: 45 names known but not registered here (`rollart plugins "
            "--details` says why)") in done.stdout
    assert "Wordle" not in done.stdout  # one line per plugin; the reasons behind --details
    done = cli("plugins", "--details")
    assert "rollart-env-gem does not register:" in done.stdout
    assert "env:gem/game:Wordle-v0-easy: needs NLTK data" in done.stdout
    records = {r["name"]: r for r in json.loads(cli("plugins", "--json").stdout)}
    assert "Hugging Face dataset" in records["rollart-env-gem"]["unavailable"]["env:gem/math:GSM8K"]
    bad = cli("envs", "gem/game:Hangman-v0-easy")
    assert bad.returncode == 2 and "did not register it: needs NLTK data" in bad.stderr
