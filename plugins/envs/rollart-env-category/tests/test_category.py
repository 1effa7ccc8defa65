"""Env ``category`` against the conformance kit, and what it deliberately does not know."""

from __future__ import annotations

import pytest
from rollart_env_category.env import CategoryEnv, CategoryOptions

from rollart_sdk.testing.env import check_env


def test_conforms():
    check_env(CategoryEnv(seed=0))


def test_asks_a_seeded_category_and_returns_no_verdict_of_its_own():
    env = CategoryEnv()
    asked = {env.reset(seed=s)[1]["category"] for s in range(40)}
    assert asked == {"color", "animal", "fruit", "feeling"}
    obs, info = env.reset(seed=3)
    assert obs == f"Name {'an' if info['category'][0] in 'aeiou' else 'a'} {info['category']}."
    _, reward, terminated, truncated, info = env.step("lemon")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["word"] == "lemon" and not info["invalid_action"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("cat")


def test_options_are_checked():
    with pytest.raises(ValueError, match="distinct"):
        CategoryOptions(words=["a", "a"])
    with pytest.raises(ValueError, match="one word"):
        CategoryOptions(words=["two words", "x"])
