"""rollart-env-arithmetic, env ``guess``: conformance, the feedback text, and the baselines.

The baselines are checked by playing the env, not by re-deriving the formulas: every
fixed guess sequence (the policies that ignore the feedback), every sequence of uniform
guesses weighted equally (the random policy), and a binary-search policy that reads only
the observation text.
"""

from __future__ import annotations

import itertools
import re

import pytest
import rollart_env_arithmetic.plugin as plugin
from pydantic import ValidationError
from rollart_env_arithmetic import GuessEnv, baselines, parse_guess

from rollart_sdk.testing.env import check_env

_SEEDS: dict[tuple[int, int, int], int] = {}


def _with_secret(env: GuessEnv, secret: int) -> str:
    """Reset until the secret is ``secret`` (reset seeds decide it); return the observation."""
    key = (env.options.low, env.options.high, secret)
    if key in _SEEDS:
        return env.reset(seed=_SEEDS[key])[0]
    for seed in range(1000):
        obs, info = env.reset(seed=seed)
        if info["answer"] == str(secret):
            _SEEDS[key] = seed
            return obs
    raise AssertionError(f"no seed below 1000 draws secret {secret}")


def _play(env: GuessEnv, secret: int, guesses) -> bool:
    """Play ``guesses`` (fixed, ignoring the feedback) against ``secret``; True on success."""
    _with_secret(env, secret)
    for g in guesses:
        _, reward, terminated, _, info = env.step(str(g))
        if terminated:
            return bool(info["success"]) and reward == 1.0
    return False


def _binary_search(env: GuessEnv, secret: int) -> bool:
    """Guess the middle of what is still possible, reading only the observation text."""
    lo, hi = env.options.low, env.options.high
    _with_secret(env, secret)
    while True:
        guess = (lo + hi) // 2
        obs, _, terminated, _, info = env.step(str(guess))
        if info["success"]:
            return True
        if terminated:
            return False
        side = re.fullmatch(rf"{guess} is too (low|high)\.", obs)
        assert side, obs
        lo, hi = (guess + 1, hi) if side.group(1) == "low" else (lo, guess - 1)


@pytest.mark.parametrize("options", [{}, {"low": 0, "high": 20, "turns": 5}, {"seed": 3}])
def test_conforms_to_check_env(options):
    check_env(lambda: GuessEnv(**options), seed=0)


def test_registered_through_the_hook(register_plugin):
    ps = register_plugin(plugin, name="rollart-env-arithmetic")
    env = ps.registry.get("env", "guess").create({"low": 1, "high": 4, "turns": 2})
    assert isinstance(env, GuessEnv)
    assert env.action_vocabulary == ["1", "2", "3", "4"]
    assert env.reset(seed=0)[0] == "Guess my number, 1 to 4."


def test_feedback_says_which_way_the_secret_lies():
    env = GuessEnv(low=1, high=8, turns=3)
    assert _with_secret(env, 6) == "Guess my number, 1 to 8."
    obs, reward, terminated, _, info = env.step("4")
    assert (obs, reward, terminated, info["guess"]) == ("4 is too low.", 0.0, False, 4)
    obs, reward, terminated, _, info = env.step("7")
    assert (obs, reward, terminated, info["attempts"]) == ("7 is too high.", 0.0, False, 2)
    obs, reward, terminated, _, info = env.step("6")
    assert (obs, reward, terminated, info["success"]) == ("Correct: 6.", 1.0, True, True)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("6")


def test_show_range_names_the_numbers_still_possible():
    env = GuessEnv(low=1, high=8, turns=4, show_range=True)
    _with_secret(env, 6)
    assert env.step("4")[0] == "4 is too low: 5 to 8."
    assert env.step("2")[0] == "2 is too low: 5 to 8."  # a guess outside the range narrows nothing
    obs, _, _, _, info = env.step("7")
    assert (obs, info["possible"]) == ("7 is too high: 5 to 6.", [5, 6])
    _with_secret(env, 8)
    env.step("4")
    assert env.step("7")[0] == "7 is too low: 8."


def test_last_wrong_guess_gives_the_direction_and_the_secret():
    env = GuessEnv(low=1, high=8, turns=1)
    _with_secret(env, 2)
    obs, reward, terminated, _, info = env.step("5")
    assert obs == "5 is too high. Out of guesses: it was 2."
    assert (reward, terminated, info["success"]) == (0.0, True, False)


@pytest.mark.parametrize("reply", ["nine", "", "9", "0"])
def test_a_reply_without_a_number_in_range_is_invalid_and_uses_a_guess(reply):
    env = GuessEnv(low=1, high=8, turns=2)
    _with_secret(env, 3)
    obs, reward, terminated, _, info = env.step(reply)
    assert obs == "Reply with a number from 1 to 8."
    assert (reward, terminated, info["invalid_action"], info["attempts"]) == (0.0, False, True, 1)


def test_every_secret_is_drawn_and_option_seed_fixes_the_first_reset():
    secrets = {GuessEnv().reset(seed=s)[1]["answer"] for s in range(200)}
    assert secrets == {str(i) for i in range(1, 9)}
    assert len({GuessEnv(seed=7).reset()[1]["answer"] for _ in range(3)}) == 1


def test_parse_guess():
    assert [parse_guess(x) for x in ("5", "I say 7, then 3", "no", None, 4)] == [5, 7, None,
                                                                                  None, 4]


@pytest.mark.parametrize(("low", "high", "turns"), [(1, 8, 3), (1, 4, 2), (0, 9, 3)])
def test_baselines_match_play(low, high, turns):
    env = GuessEnv(low=low, high=high, turns=turns)
    numbers = range(low, high + 1)
    n = len(numbers)
    got = baselines(low, high, turns)
    # Ignoring the feedback, a policy is a guess sequence fixed in advance: the best of all.
    fixed = max(sum(_play(env, s, seq) for s in numbers)
                for seq in itertools.product(numbers, repeat=turns)) / n
    assert got["ignore_feedback"] == pytest.approx(fixed)
    # Uniform random guesses: every sequence equally likely.
    sequences = list(itertools.product(numbers, repeat=turns))
    rand = sum(_play(env, s, seq) for s in numbers for seq in sequences) / (n * len(sequences))
    assert got["random"] == pytest.approx(rand)
    assert got["binary_search"] == pytest.approx(sum(_binary_search(env, s)
                                                     for s in numbers) / n)


def test_baselines_of_the_example():
    got = baselines(1, 8, 3)
    assert got == pytest.approx({"random": 1 - (7 / 8) ** 3, "ignore_feedback": 3 / 8,
                                 "binary_search": 7 / 8})


def test_options_are_checked():
    with pytest.raises(ValidationError, match="greater than low"):
        GuessEnv(low=5, high=5)
    with pytest.raises(ValidationError, match="more than 512"):
        GuessEnv(low=0, high=1000)
    with pytest.raises(ValidationError, match="turns"):
        GuessEnv(turns=0)
