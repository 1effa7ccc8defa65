"""What a plugin author meets on the command line (issue 38): listings one line per plugin
with simulated backends apart, an unknown name with the closest few names and a count,
option descriptions, and a warning for an option named like a task key."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rollart_sdk.errors import UnknownBackendError, closest, name_list
from rollart_sdk.testing.dists import make_dist, run_cli

ROOT = Path(__file__).resolve().parents[1]

CLASHING_ENV = '''
import gymnasium
from pydantic import BaseModel, ConfigDict, Field
from rollart_sdk import hookimpl


class ClashOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_turns: int = Field(3, description="the env's own turn limit")


class ClashEnv(gymnasium.Env):
    action_vocabulary = ["a", "b"]

    def __init__(self, max_turns=3):
        self.max_turns, self.turns = max_turns, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turns = 0
        return "say a or b", {}

    def step(self, action):
        self.turns += 1
        return "again", float(action == "a"), False, self.turns >= self.max_turns, {}


@hookimpl
def rollart_register_envs(registry):
    registry.register("clash", factory="clash_env_plugin:ClashEnv",
                      options="clash_env_plugin:ClashOptions", summary="clashing option")
'''


def test_unknown_name_among_many_lists_the_closest_few_and_a_count():
    installed = [f"gem/rg:task_{i}" for i in range(140)] + ["frozenlake", "sokoban"]
    err = UnknownBackendError("env", "frozenlak", installed)
    assert err.suggestions == ["frozenlake"]
    listed = str(err).split("installed envs: ", 1)[1]
    assert listed.startswith("frozenlake, ") and "... and 137 more: `rollart envs`." in listed
    assert listed.count(",") == 4  # five names, not 142
    few = UnknownBackendError("engine", "tourch", ["sglang", "sim", "torch", "vllm"])
    assert "installed engines: sglang, sim, torch, vllm." in str(few)
    assert "more" not in str(few)
    many = name_list("reward", "x", [f"r{i}" for i in range(20)])
    assert many.endswith("and 15 more: `rollart plugins --kind reward`")


def test_closest_reads_the_last_part_of_a_name_and_ignores_case():
    names = ["gem/game:Mastermind-v0-easy", "gem/rg:sokoban", "sokoban", "frozenlake"]
    assert closest("mastermind", names)[0] == "gem/game:Mastermind-v0-easy"
    assert closest("sokobn", names)[:2] == ["sokoban", "gem/rg:sokoban"]
    assert closest("zzzz", names) == []


def _table_rows(text: str, title: str) -> list[str]:
    """The body rows of the rich table whose title contains ``title``."""
    block = text.split(title, 1)[1]
    body = block.split("┡", 1)[1].split("└", 1)[0]
    return [line for line in body.splitlines() if line.startswith("│")]


def test_plugins_kind_env_is_one_line_per_plugin_with_sim_apart():
    res = run_cli("plugins", "--kind", "env")
    assert res.returncode == 0, res.stderr
    listed = json.loads(run_cli("plugins", "--json", "--kind", "env").stdout)
    real = [r for r in listed if any(n for n in r["registered"].get("env", [])
                                     if f"env:{n}" not in r["simulated"])]
    rows = _table_rows(res.stdout, "rollart plugins (kind env)")
    assert len(rows) == len(real)  # one line each, however long the summaries
    assert not any("env: sim" in row for row in rows)
    sims = _table_rows(res.stdout, "simulation backends")
    assert len(sims) == 1 and "env: sim" in sims[0] and "rollart-builtins-sims" in sims[0]
    assert "Wordle" not in res.stdout  # gem's unregistered names: behind --details


def test_envs_lists_the_sim_workload_apart():
    res = run_cli("envs")
    assert res.returncode == 0, res.stderr
    table, _, after = res.stdout.partition("Simulated workloads")
    assert not re.search(r"^│ sim ", table, flags=re.MULTILINE)
    assert after.startswith(" (rollart sim") and ": sim" in after.splitlines()[0]


def test_envs_named_shows_only_those():
    res = run_cli("envs", "frozenlake")
    assert res.returncode == 0, res.stderr
    assert "invalid_action_penalty" in res.stdout  # its options in full
    assert "not registered here" not in res.stdout  # nothing about other names
    assert "not registered here" in run_cli("envs").stdout  # the full list says it


def test_options_show_a_description_for_every_trainer_option():
    res = run_cli("plugins", "--options", "trainer:torch", "--json")
    schema = json.loads(res.stdout)
    empty = [k for k, v in schema["properties"].items() if not v.get("description")]
    assert len(schema["properties"]) >= 31 and empty == []
    mode = json.loads(run_cli("plugins", "--options", "reward:rule", "--json").stdout)
    assert "module doc" not in mode["properties"]["mode"]["description"]
    assert "exact_match" in mode["properties"]["mode"]["description"]


def test_validate_warns_on_an_env_option_named_like_a_task_key(fake_site, tmp_path):
    make_dist(fake_site, "rollart-env-clash", "clash_env_plugin", CLASHING_ENV)
    cfg = tmp_path / "c.yaml"
    cfg.write_text((ROOT / "examples" / "minimal.yaml").read_text().replace(
        "name: frozenlake\n", "name: clash\n").replace(
        'options: {desc: ["SFF", "FHF", "FFG"], obs_format: compact}', "options: {max_turns: 2}"))
    res = run_cli("validate", str(cfg))
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())
    assert ("tasks.0.env.options: env 'clash' (rollart-env-clash) has an option 'max_turns', "
            "the name of the task key tasks.0.max_turns") in out
    assert "the task's max_turns=10 is not the env's" in out
