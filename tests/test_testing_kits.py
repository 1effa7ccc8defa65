"""The env and reward conformance kits catch each broken property they promise to."""

from __future__ import annotations

import asyncio
import random

import gymnasium
import pytest
from gymnasium import spaces

from rollart_sdk.testing.env import check_env
from rollart_sdk.testing.reward import check_reward, make_request
from rollart_sdk.types import RewardResult


class CountdownEnv(gymnasium.Env):
    """A correct text env: say 'tick' until a seeded countdown ends."""

    action_vocabulary = ["tick", "wait"]
    system_prompt = "Say tick."

    def __init__(self) -> None:
        self.observation_space = spaces.Text(
            max_length=200, min_length=0, charset="-0123456789 lefts:"
        )
        self.action_space = spaces.Text(max_length=200)
        self.left = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(2, 6))
        return self._obs(), {}

    def _obs(self):
        return f"left: {self.left}"

    def step(self, action):
        valid = isinstance(action, str) and action.strip() in self.action_vocabulary
        if valid and action.strip() == "tick":
            self.left -= 1
        done = self.left <= 0
        return self._obs(), 1.0 if done else 0.0, done, False, {"invalid_action": not valid}


def test_a_correct_env_passes():
    check_env(CountdownEnv, seed=3)
    check_env(CountdownEnv(), seed=3)


class _IntObs(CountdownEnv):
    def _obs(self):
        return self.left


class _Ansi(CountdownEnv):
    def _obs(self):
        return f"\x1b[41m{self.left}\x1b[0m"


class _Unseeded(CountdownEnv):
    """Draws from the global RNG, not self.np_random: reset(seed) does not fix it."""

    def _obs(self):
        return f"left: {self.left} {random.randint(10**8, 10**9)}"


class _CrashesOnInvalid(CountdownEnv):
    def step(self, action):
        if action.strip() not in self.action_vocabulary:
            raise ValueError("bad action")
        return super().step(action)


class _Endless(CountdownEnv):
    def step(self, action):
        obs, r, _, _, info = super().step(action)
        return obs, r, False, False, info


class _BoolReward(CountdownEnv):
    def step(self, action):
        obs, r, t, tr, info = super().step(action)
        return obs, t, t, tr, info


class _NanReward(CountdownEnv):
    def step(self, action):
        obs, r, t, tr, info = super().step(action)
        return obs, float("nan"), t, tr, info


class _DupVocab(CountdownEnv):
    action_vocabulary = ["tick", "tick"]


class _OutOfSpace(CountdownEnv):
    def _obs(self):
        return f"Left: {self.left}!"  # 'L' and '!' are not in the charset


class _OldReset(CountdownEnv):
    def reset(self):  # no seed keyword
        return super().reset()


class _IntFlags(CountdownEnv):
    def step(self, action):
        obs, r, t, tr, info = super().step(action)
        return obs, r, int(t), tr, info


@pytest.mark.parametrize(
    ("env_cls", "prop"),
    [
        (_IntObs, "obs_is_str"),
        (_Ansi, "no_ansi"),
        (_Unseeded, "determinism"),
        (_CrashesOnInvalid, "invalid_action"),
        (_Endless, "terminates"),
        (_BoolReward, "reward_is_float"),
        (_NanReward, "reward_is_float"),
        (_DupVocab, "action_vocabulary"),
        (_OutOfSpace, "obs_in_space"),
        (_OldReset, "reset_signature"),
        (_IntFlags, "flags_are_bool"),
    ],
)
def test_each_broken_env_property_is_named(env_cls, prop):
    with pytest.raises(AssertionError, match=rf"check_env\[{prop}\]"):
        check_env(env_cls, seed=0, max_episode_steps=50)


def test_unknown_registered_name_is_reported():
    with pytest.raises(AssertionError, match=r"check_env\[gymnasium_make\].*no env 'no-such-env'"):
        check_env("no-such-env")


class EchoReward:
    async def score(self, request):
        return RewardResult(request.trajectory_id, float(request.env_return), {"why": "echo"})


def test_a_correct_reward_passes_and_matches_expected():
    cases = [(make_request(env_return=v, trajectory_id=f"t{v}"), v) for v in (0.0, 0.5, 2.0)]
    results = check_reward(EchoReward(), cases)
    assert [r.reward for r in results] == [0.0, 0.5, 2.0]
    with pytest.raises(AssertionError, match=r"check_reward\[expected\]: case 1"):
        check_reward(EchoReward(), [(make_request(), 0.0), (make_request(env_return=1.0), 0.0)])


def test_check_reward_works_inside_a_running_event_loop():
    async def main():
        return check_reward(EchoReward(), [(make_request(env_return=1.0), 1.0)])

    assert asyncio.run(main())[0].reward == 1.0


class _SyncScore:
    def score(self, request):
        return RewardResult(request.trajectory_id, 0.0)


class _WrongId(EchoReward):
    async def score(self, request):
        return RewardResult("other", 0.0)


class _Counter(EchoReward):
    def __init__(self):
        self.n = 0

    async def score(self, request):
        self.n += 1
        return RewardResult(request.trajectory_id, float(self.n))


class _SharedState(EchoReward):
    async def score(self, request):
        self.current = request.env_return
        await asyncio.sleep(0)
        return RewardResult(request.trajectory_id, float(self.current))


class _NanScore(EchoReward):
    async def score(self, request):
        return RewardResult(request.trajectory_id, float("inf"))


class _OpaqueDetails(EchoReward):
    async def score(self, request):
        return RewardResult(request.trajectory_id, 0.0, {"obj": object()})


@pytest.mark.parametrize(
    ("backend", "prop"),
    [
        (_SyncScore(), "score_is_async"),
        (_WrongId(), "trajectory_id"),
        (_Counter(), "deterministic"),
        (_SharedState(), "concurrent"),
        (_NanScore(), "reward_is_float"),
        (_OpaqueDetails(), "details"),
    ],
)
def test_each_broken_reward_property_is_named(backend, prop):
    cases = [(make_request(env_return=float(i), trajectory_id=f"t{i}"), None) for i in range(3)]
    with pytest.raises(AssertionError, match=rf"check_reward\[{prop}\]"):
        check_reward(backend, cases)
