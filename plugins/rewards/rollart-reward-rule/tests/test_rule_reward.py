"""rollart-reward-rule: conformance (check_reward) and each mode's arithmetic."""

from __future__ import annotations

import asyncio

import pytest
import rollart_reward_rule.plugin as plugin
from pydantic import ValidationError
from rollart_reward_rule import RuleReward

from rollart_sdk.errors import ConfigError
from rollart_sdk.testing.reward import check_reward, make_request


def test_env_return_mode():
    cases = [
        (make_request(env_return=1.0, trajectory_id="a"), 2.0),
        (make_request(env_return=-0.5, trajectory_id="b"), -1.0),
        (make_request(env_return=0.0, trajectory_id="c"), 0.0),
    ]
    results = check_reward(RuleReward(scale=2.0), cases)
    assert [r.trajectory_id for r in results] == ["a", "b", "c"]
    assert results[0].details["explanation"] == "env return 1: 1 x 2 = 2"


def test_exact_match_numbers_compare_by_value():
    reward = RuleReward(mode="exact_match")
    cases = [
        (
            make_request(responses=["so 37+45 = 82."], info={"answer": "82"}, trajectory_id="ok"),
            1.0,
        ),
        (make_request(responses=["I think 81"], info={"answer": "82"}, trajectory_id="bad"), 0.0),
        (make_request(responses=["1,665"], info={"answer": 1665}, trajectory_id="sep"), 1.0),
        (
            make_request(
                responses=["first 3", "then 4"], info={"answer": "3"}, trajectory_id="last"
            ),
            0.0,
        ),
        (make_request(responses=["no idea"], info={"answer": "-8"}, trajectory_id="none"), 0.0),
    ]
    results = check_reward(reward, cases)
    assert results[0].details["got"] == 82.0 and results[0].details["expected"] == "82"
    assert results[4].details["format_problems"] == ["no number in the final response"]


def test_exact_match_text_is_stripped_and_case_folded():
    cases = [
        (make_request(responses=["  Paris \n"], info={"answer": "paris"}), 1.0),
        (make_request(responses=["Paris, France"], info={"answer": "Paris"}), 0.0),
    ]
    check_reward(RuleReward(mode="exact_match"), cases)


def test_regex_and_success_modes():
    check_reward(
        RuleReward(mode="regex", pattern=r"Answer: -?\d+$", scale=0.5),
        [
            (make_request(responses=["work\nAnswer: 12"]), 0.5),
            (make_request(responses=["Answer: twelve"]), 0.0),
        ],
    )
    check_reward(
        RuleReward(mode="success"),
        [
            (make_request(info={"success": True}, env_return=0.3), 1.0),
            (make_request(info={"success": False}, env_return=0.3), 0.0),
        ],
    )


def test_format_penalty_applies_to_pattern_misses_and_invalid_actions():
    reward = RuleReward(mode="exact_match", pattern=r"Answer: ", format_penalty=0.2)
    results = check_reward(
        reward,
        [
            (make_request(responses=["Answer: 82"], info={"answer": "82"}), 1.0),
            (make_request(responses=["82"], info={"answer": "82"}), 0.8),
            (make_request(responses=["Answer: 1"], info={"answer": "82"}), 0.0),
            (
                make_request(
                    responses=["Answer: 82"], info={"answer": "82", "invalid_action": True}
                ),
                0.8,
            ),
        ],
    )
    assert results[1].details["format_ok"] is False
    assert "pattern" in results[1].details["format_problems"][0]
    assert results[1].details["explanation"].endswith("- 0.2 format penalty = 0.8")


def test_missing_ground_truth_says_what_to_do():
    with pytest.raises(ValueError, match=r"no info\['answer'\].*env_return"):
        asyncio.run(RuleReward(mode="exact_match").score(make_request(trajectory_id="t9")))
    with pytest.raises(ValueError, match=r"info\['success'\]"):
        asyncio.run(RuleReward(mode="success").score(make_request()))


def test_options_are_validated():
    with pytest.raises(ValidationError, match="needs a pattern"):
        RuleReward(mode="regex")
    with pytest.raises(ValidationError, match="regular expression"):
        RuleReward(mode="regex", pattern="(")
    with pytest.raises(ValidationError):
        RuleReward(mode="judge")  # type: ignore[arg-type]


@pytest.mark.timeout(60)  # the hang guard: with Python's re this search takes hours
@pytest.mark.parametrize("mode", ["regex", "exact_match"])
def test_a_catastrophic_pattern_fails_the_score_within_its_timeout(mode):
    # (a|aa)+$ on n a's and a b tries every split of the a's (Fibonacci(n) of them).
    reward = RuleReward(mode=mode, pattern=r"(a|aa)+$", pattern_timeout_s=0.2)
    request = make_request(responses=["a" * 60 + "b"], info={"answer": "7"},
                           trajectory_id="slow-1")
    with pytest.raises(ValueError) as info:
        asyncio.run(reward.score(request))
    msg = str(info.value)
    assert "'slow-1'" in msg and "61 characters" in msg and "pattern_timeout_s=0.2" in msg, msg
    assert "nested" in msg and "tasks[].reward.options.pattern_timeout_s" in msg, msg
    # The same pattern on a response it settles quickly still scores.
    quick = asyncio.run(reward.score(make_request(responses=["aaaa"], info={"answer": "7"})))
    if mode == "regex":
        assert quick.reward == 1.0 and quick.details["match"] == "aaaa"
    else:  # the format check passed: the only problem is the missing number
        assert quick.details["format_problems"] == ["no number in the final response"]


def test_pattern_timeout_is_validated():
    with pytest.raises(ValidationError, match="pattern_timeout_s"):
        RuleReward(mode="regex", pattern="a", pattern_timeout_s=0)


def test_registered_through_the_hook(register_plugin):
    desc = register_plugin(plugin, name="rollart-reward-rule").registry.get("reward", "rule")
    backend = desc.create({"mode": "exact_match", "scale": 3})
    check_reward(backend, [(make_request(responses=["7"], info={"answer": "7"}), 3.0)])
    with pytest.raises(ConfigError, match=r"tasks\[0\].reward_options.scal"):
        desc.validate_options({"scal": 2}, where="tasks[0].reward_options")


def test_agrees_with_the_arithmetic_env():
    arithmetic = pytest.importorskip("rollart_env_arithmetic")
    env = arithmetic.ArithmeticEnv(ops=["+", "-", "*"], num_digits=3)
    reward = RuleReward(mode="exact_match")
    for seed in range(10):
        prompt, info = env.reset(seed=seed)
        reply = info["answer"] if seed % 2 else str(int(info["answer"]) + seed)
        _, env_reward, terminated, _, info = env.step(reply)
        request = make_request(
            responses=[reply],
            info=info,
            env_return=env_reward,
            terminated=terminated,
            prompt=prompt,
            trajectory_id=f"s{seed}",
        )
        (result,) = check_reward(reward, [(request, env_reward)])
        assert result.reward == env_reward
