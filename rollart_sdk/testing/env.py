"""Conformance kit for text environments, in the spirit of gymnasium's ``check_env``.

Call it from a plugin's tests::

    from rollart_sdk.testing.env import check_env

    def test_conforms():
        check_env(lambda: MyEnv(size=3), seed=0)   # a factory: two envs are compared
        check_env("myenv")                          # a registered name: via gymnasium.make

Every failure is an ``AssertionError`` whose message starts with
``check_env[<property>]`` so the broken property is obvious.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from numbers import Real
from typing import Any

import numpy as np

from rollart_sdk.errors import name_list

__all__ = ["check_env"]

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b")
INVALID_ACTION = "@@ this is not a valid action @@"
# Replies tried on free-text envs (no action_vocabulary): numbers, words, empty text.
FREE_TEXT_PROBES = ("0", "1", "42", "yes", "no", "Answer: 7", "")

EnvSource = Any  # a TextEnv, a zero-argument factory returning one, or a registered name


def _fail(prop: str, msg: str) -> AssertionError:
    return AssertionError(f"check_env[{prop}]: {msg}")


def _unwrapped(env: Any) -> Any:
    return getattr(env, "unwrapped", env)


def _attr(env: Any, name: str) -> Any:
    """An attribute of the env, looking through gymnasium wrappers (which hide them)."""
    if hasattr(env, name):
        return getattr(env, name)
    return getattr(_unwrapped(env), name, None)


def _check_no_ansi(prop: str, text: str, where: str) -> None:
    if ANSI_RE.search(text):
        raise _fail(
            prop,
            f"{where} contains ANSI escape codes ({text[:60]!r}...); strip them "
            "(gymnasium's 'ansi' render adds colour codes a tokenizer should never see)",
        )


def _check_reset(env: Any, seed: int | None) -> tuple[str, dict]:
    try:
        result = env.reset(seed=seed)
    except TypeError as exc:
        raise _fail(
            "reset_signature", f"reset(seed=...) raised {exc}; accept seed and options"
        ) from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise _fail(
            "reset_returns", f"reset() must return (obs, info), got {type(result).__name__}"
        )
    obs, info = result
    if not isinstance(obs, str):
        raise _fail("obs_is_str", f"reset() observation must be str, got {type(obs).__name__}")
    if not isinstance(info, dict):
        raise _fail("info_is_dict", f"reset() info must be a dict, got {type(info).__name__}")
    _check_no_ansi("no_ansi", obs, "reset() observation")
    _check_in_space(env, obs, "reset()")
    return obs, info


def _check_step(env: Any, action: str, where: str) -> tuple[str, float, bool, bool, dict]:
    try:
        result = env.step(action)
    except Exception as exc:
        raise _fail(
            "step_accepts_action",
            f"{where}: step({action!r}) raised {type(exc).__name__}: {exc}",
        ) from exc
    if not (isinstance(result, tuple) and len(result) == 5):
        raise _fail(
            "step_returns",
            f"step() must return (obs, reward, terminated, truncated, info), got {result!r:.80}",
        )
    obs, reward, terminated, truncated, info = result
    if not isinstance(obs, str):
        raise _fail(
            "obs_is_str", f"{where}: step() observation must be str, got {type(obs).__name__}"
        )
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, Real):
        raise _fail("reward_is_float", f"{where}: reward must be a float, got {reward!r}")
    if not math.isfinite(float(reward)):
        raise _fail("reward_is_float", f"{where}: reward must be finite, got {reward!r}")
    for flag_name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise _fail("flags_are_bool", f"{where}: {flag_name} must be bool, got {flag!r}")
    if not isinstance(info, dict):
        raise _fail(
            "info_is_dict", f"{where}: step() info must be a dict, got {type(info).__name__}"
        )
    _check_no_ansi("no_ansi", obs, f"{where}: step() observation")
    _check_in_space(env, obs, "step()")
    return obs, float(reward), bool(terminated), bool(truncated), info


def _check_in_space(env: Any, obs: str, where: str) -> None:
    space = _attr(env, "observation_space")
    if space is None:
        return
    try:
        ok = space.contains(obs)
    except Exception:  # noqa: BLE001 - a non-text space cannot hold a str at all
        ok = False
    if not ok:
        raise _fail(
            "obs_in_space",
            f"{where} observation is not in observation_space {space!r} (length {len(obs)}). "
            "Use gymnasium.spaces.Text with a charset that covers the text (e.g. "
            "string.printable) and a large enough max_length.",
        )


def _vocabulary(env: Any) -> list[str] | None:
    vocab = _attr(env, "action_vocabulary")
    if vocab is None:
        return None
    if (
        not isinstance(vocab, (list, tuple))
        or not vocab
        or not all(isinstance(a, str) and a.strip() for a in vocab)
    ):
        raise _fail(
            "action_vocabulary",
            f"action_vocabulary must be a non-empty list of non-empty strings, got {vocab!r}",
        )
    if len(set(vocab)) != len(vocab):
        raise _fail("action_vocabulary", f"action_vocabulary has duplicates: {vocab!r}")
    return list(vocab)


def _rollout(
    env: Any, seed: int, actions_rng: random.Random, choices: list[str], bound: int
) -> list:
    """One episode under random choices; returns the (obs, reward, term, trunc) sequence."""
    obs, _ = _check_reset(env, seed)
    trace: list[Any] = [obs]
    for t in range(bound):
        action = actions_rng.choice(choices)
        obs, reward, terminated, truncated, _ = _check_step(env, action, f"step {t}")
        trace.append((action, obs, reward, terminated, truncated))
        if terminated or truncated:
            return trace
    raise _fail(
        "terminates",
        f"episode did not end within {bound} random actions; add a step limit "
        "(truncate) so every episode ends",
    )


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        close()


def check_env(
    env_or_factory: EnvSource,
    seed: int = 0,
    *,
    max_episode_steps: int = 1000,
    episodes: int = 3,
) -> None:
    """Assert that a text environment follows :class:`rollart_sdk.interfaces.TextEnv`.

    ``env_or_factory`` is an env, a zero-argument callable returning a fresh env, or the
    name the env is registered under (then it is built with
    ``gymnasium.make("rollart/<name>")``, which also checks the gymnasium registration).
    Properties checked, each named in the failure message:

    - ``reset_signature`` / ``reset_returns`` / ``step_returns``: gymnasium's API;
    - ``obs_is_str``, ``reward_is_float`` (finite), ``flags_are_bool``, ``info_is_dict``;
    - ``no_ansi``: observations and ``system_prompt`` hold no ANSI escape codes;
    - ``obs_in_space``: observations lie in ``observation_space`` when there is one;
    - ``action_vocabulary``: if present, a list of unique strings, each accepted by step;
    - ``invalid_action``: a nonsense reply is a step, not an exception;
    - ``determinism``: the same seed gives the same observations, rewards and flags
      (two envs when a factory or name is given, one env reset twice otherwise);
    - ``terminates``: ``episodes`` random episodes each end within ``max_episode_steps``;
    - ``gymnasium_make``: a registered name can be made with gymnasium.
    """
    factory = _factory_of(env_or_factory)
    env = factory() if factory is not None else env_or_factory
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise _fail("interface", f"{type(env).__name__} has no {method}() method")
    try:
        _check_system_prompt(env)
        vocab = _vocabulary(env)
        choices = vocab if vocab is not None else list(FREE_TEXT_PROBES)

        # Every vocabulary action (or free-text probe) is accepted from a fresh reset.
        for action in choices:
            _check_reset(env, seed)
            _check_step(env, action, f"action {action!r}")

        # A nonsense action is a step (usually a no-op with a flag), never an exception.
        _check_reset(env, seed)
        try:
            _check_step(env, INVALID_ACTION, "invalid action")
        except AssertionError as exc:
            raise _fail(
                "invalid_action",
                f"an invalid action must not crash the env: {exc}. Treat it as a no-op step "
                "and set info['invalid_action'] = True.",
            ) from exc

        # Determinism: same seed + same actions -> same trajectory.
        first = _rollout(env, seed, random.Random(seed), choices, max_episode_steps)
        other = factory() if factory is not None else env
        try:
            second = _rollout(other, seed, random.Random(seed), choices, max_episode_steps)
        finally:
            if other is not env:
                _close(other)
        if first != second:
            diverge = next(
                (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                min(len(first), len(second)),
            )
            raise _fail(
                "determinism",
                f"reset(seed={seed}) and the same actions gave different trajectories from "
                f"step {diverge}: {first[diverge : diverge + 1]!r} vs {second[diverge : diverge + 1]!r}. "
                "Seed every random draw from self.np_random (set by super().reset(seed=seed)).",
            )

        # Termination under random actions, with different seeds.
        for episode in range(episodes):
            _rollout(
                env,
                seed + 1 + episode,
                random.Random(seed + 1 + episode),
                choices,
                max_episode_steps,
            )
    finally:
        if factory is not None:
            _close(env)


def _factory_of(env_or_factory: EnvSource) -> Callable[[], Any] | None:
    """A zero-argument factory for ``env_or_factory``, or None when it is an env."""
    if isinstance(env_or_factory, str):
        return _gymnasium_factory(env_or_factory)
    if isinstance(env_or_factory, type) or (
        callable(env_or_factory) and not hasattr(env_or_factory, "step")
    ):
        return env_or_factory
    return None


def _check_system_prompt(env: Any) -> None:
    prompt = _attr(env, "system_prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise _fail("system_prompt", f"system_prompt must be str, got {type(prompt).__name__}")
        _check_no_ansi("no_ansi", prompt, "system_prompt")


def _gymnasium_factory(name: str) -> Callable[[], Any]:
    """``gymnasium.make("rollart/<name>")`` after loading plugins (which registers envs)."""
    import gymnasium

    from rollart_sdk.plugins import get_plugins

    env_id = name if name.startswith("rollart/") else f"rollart/{name}"
    plain = env_id.split("/", 1)[1]
    registry = get_plugins().registry
    if plain not in registry.names("env"):
        raise _fail(
            "gymnasium_make",
            f"no env {plain!r} is registered; installed envs: "
            f"{name_list('env', plain, registry.names('env'))}. pip install the plugin, or pass "
            "the env (or a factory) instead of a name.",
        )

    def make() -> Any:
        try:
            return gymnasium.make(env_id)
        except Exception as exc:
            raise _fail(
                "gymnasium_make", f"gymnasium.make({env_id!r}) raised {type(exc).__name__}: {exc}"
            ) from exc

    return make
