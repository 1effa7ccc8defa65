"""rollart-env-sokoban: conformance, dynamics, fixed levels solvable, seeded generation."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import rollart_env_sokoban.plugin as plugin
from rollart_env_sokoban import (
    LEVELS,
    SokobanTextEnv,
    generate_level,
    parse_action,
    parse_level,
    solve,
)

from rollart_sdk.errors import ConfigError
from rollart_sdk.testing.env import check_env


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"mode": "fixed"},
        {"mode": "fixed", "levels": ["two-boxes"], "reward_shape": "shaped"},
        {"mode": "fixed", "custom": ["#####", "#PXO#", "#####"], "max_steps": 3},
        {"height": 8, "width": 8, "num_boxes": 2, "invalid_action_penalty": 0.1},
    ],
)
def test_conforms_to_check_env(options):
    check_env(lambda: SokobanTextEnv(**options), seed=0)


def test_registered_through_the_hook(register_plugin):
    ps = register_plugin(plugin, name="rollart-env-sokoban")
    desc = ps.registry.get("env", "sokoban")
    env = desc.create({"mode": "fixed", "levels": ["corner-1"]})
    assert isinstance(env, SokobanTextEnv)
    obs, info = env.reset(seed=0)  # the options reached the env: that shipped level
    assert info["level"] == "corner-1"
    assert obs == "\n".join(parse_level(LEVELS["corner-1"], "corner-1").rows())
    check_env(lambda: gymnasium.make("rollart/sokoban"), seed=2)


def test_bad_options_are_config_errors(register_plugin):
    desc = register_plugin(plugin).registry.get("env", "sokoban")
    with pytest.raises(ConfigError, match="shipped levels"):
        desc.validate_options({"mode": "fixed", "levels": ["nope"]})
    with pytest.raises(ConfigError, match="row 1 column 2"):
        desc.validate_options({"mode": "fixed", "custom": ["#####", "#P?O#", "#####"]})
    with pytest.raises(ConfigError, match="mode: fixed"):
        desc.validate_options({"levels": ["push-1"]})
    with pytest.raises(ConfigError, match="already solved"):
        desc.validate_options({"mode": "fixed", "custom": ["####", "#P*#", "####"]})
    with pytest.raises(ConfigError, match="do not fit"):
        desc.validate_options({"height": 4, "width": 4, "num_boxes": 2})


@pytest.mark.parametrize("name", list(LEVELS))
def test_every_shipped_level_is_solvable_and_the_solution_wins(name):
    path = solve(parse_level(LEVELS[name]))
    assert path, f"{name} has no solution"
    env = SokobanTextEnv(mode="fixed", levels=[name], max_steps=len(path))
    env.reset(seed=0)
    total = 0.0
    for i, move in enumerate(path):
        _, reward, terminated, truncated, info = env.step(move)
        total += reward
        assert terminated == (i == len(path) - 1) and not truncated
    assert total == 1.0 and info["success"] and info["boxes_on_target"] == info["boxes"]


def test_push_moves_the_box_and_walls_block():
    env = SokobanTextEnv(mode="fixed", custom=["######", "#P_XO#", "######"], reward_shape="shaped")
    obs, info = env.reset(seed=0)
    assert obs == "######\n#P_XO#\n######" and info["level"] == "custom"
    obs, reward, *_ = env.step("Up")
    assert obs.startswith("Up is blocked.") and reward == 0.0
    obs, reward, term, _, info = env.step("I move right")
    assert obs.splitlines()[-2] == "#_PXO#" and reward == 0.0 and not term
    obs, reward, term, _, info = env.step("Right")
    assert obs.splitlines()[-2] == "#__P*#"
    assert reward == pytest.approx(1.1) and term and info["success"]  # +0.1 shaping +1 solve


def test_a_box_against_a_box_does_not_move():
    env = SokobanTextEnv(mode="fixed", custom=["#######", "#PXX_O#", "#____O#", "#######"])
    env.reset(seed=0)
    obs, *_ , info = env.step("Right")
    assert obs.startswith("Right is blocked.") and info["position"] == [1, 1]


def test_invalid_reply_is_a_penalised_no_op_and_truncation():
    env = SokobanTextEnv(mode="fixed", levels=["push-1"], invalid_action_penalty=0.5, max_steps=2)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step("jump")
    assert info["invalid_action"] and reward == -0.5 and not (term or trunc)
    assert "Invalid action" in obs
    _, _, term, trunc, _ = env.step("Left")
    assert (term, trunc) == (False, True)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Right")


@pytest.mark.parametrize(("h", "w", "boxes"), [(5, 5, 1), (6, 6, 1), (7, 7, 2), (8, 8, 2)])
def test_generated_levels_are_solvable_and_unsolved_at_start(h, w, boxes):
    for seed in range(8):
        level = generate_level(np.random.default_rng(seed), h, w, boxes, reverse_steps=40)
        assert not level.solved and len(level.boxes) == boxes
        path = solve(level)
        assert path, f"seed {seed}: unsolvable\n" + "\n".join(level.rows())
        # The solver's path really wins the level in the env (not just "some list").
        env = SokobanTextEnv(mode="fixed", custom=level.rows(), max_steps=len(path))
        env.reset(seed=0)
        for i, move in enumerate(path):
            _, _, terminated, truncated, info = env.step(move)
            assert terminated == (i == len(path) - 1) and not truncated, (seed, i, path)
        assert info["success"] and info["boxes_on_target"] == boxes


def test_generation_follows_the_seed():
    env = SokobanTextEnv()
    levels = {s: env.reset(seed=s)[0] for s in range(6)}
    assert env.reset(seed=4)[0] == levels[4]
    assert len(set(levels.values())) > 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Up", "Up"), (" left\n", "Left"), ("go RIGHT then up", "Right"), ("upward", None),
     ("", None), (None, None)],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected
