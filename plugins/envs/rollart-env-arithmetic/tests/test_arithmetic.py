"""rollart-env-arithmetic: conformance (check_env) and grading of answers."""

from __future__ import annotations

import random
import re

import gymnasium
import pytest
import rollart_env_arithmetic.plugin as plugin
from rollart_env_arithmetic import ArithmeticEnv, parse_final_number, worked_steps

from rollart_sdk.errors import ConfigError
from rollart_sdk.testing.env import check_env


def _truth(question: str) -> int:
    """Independent ground truth: Python evaluates the question string."""
    assert set(question) <= set("0123456789+-*"), question
    return int(eval(question))


@pytest.mark.parametrize(
    "options",
    [{}, {"answer_style": "steps", "ops": ["*"]}, {"turns": 3, "num_digits": 4}, {"seed": 11}],
)
def test_conforms_to_check_env(options):
    check_env(lambda: ArithmeticEnv(**options), seed=0)


def test_registered_through_the_hook_and_made_by_gymnasium(register_plugin):
    ps = register_plugin(plugin, name="rollart-env-arithmetic")
    env = ps.registry.get("env", "arithmetic").create({"num_digits": 3})
    assert isinstance(env, ArithmeticEnv)
    for seed in range(5):  # num_digits reached the env: 3-digit operands (default: 2)
        question = env.reset(seed=seed)[1]["question"]
        operands = re.split(r"[-+*]", question)
        assert len(operands) == 2 and all(len(x) == 3 for x in operands), question
    check_env(lambda: gymnasium.make("rollart/arithmetic"), seed=2)
    with pytest.raises(ConfigError, match="allowed keys"):
        ps.registry.get("env", "arithmetic").validate_options({"digits": 3})
    with pytest.raises(ConfigError, match="ops"):
        ps.registry.get("env", "arithmetic").validate_options({"ops": ["/"]})


def test_prompt_and_ground_truth():
    env = ArithmeticEnv(num_digits=2, ops=["+"])
    obs, info = env.reset(seed=0)
    assert obs == f"Compute {info['question']}. Answer with the number."
    assert int(info["answer"]) == _truth(info["question"])
    a, b = info["question"].split("+")
    assert len(a) == 2 and len(b) == 2


def test_correct_answer_scores_one_and_ends():
    env = ArithmeticEnv(ops=["+", "-", "*"], num_digits=3)
    for seed in range(20):
        _, info = env.reset(seed=seed)
        obs, reward, terminated, truncated, info = env.step(f"The result is {info['answer']}.")
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
        assert obs == "Correct."


def test_wrong_answer_scores_zero_and_ends():
    env = ArithmeticEnv()
    _, info = env.reset(seed=1)
    wrong = int(info["answer"]) + 1
    obs, reward, terminated, _, info = env.step(str(wrong))
    assert (reward, terminated, info["success"], info["parsed"]) == (0.0, True, False, wrong)
    assert info["answer"] in obs
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")


def test_more_turns_allow_a_retry():
    env = ArithmeticEnv(turns=2)
    _, info = env.reset(seed=2)
    obs, reward, terminated, _, step_info = env.step("no idea")
    assert (reward, terminated, step_info["invalid_action"]) == (0.0, False, True)
    assert "1 attempt(s) left" in obs and info["question"] in obs
    _, reward, terminated, _, _ = env.step(info["answer"])
    assert (reward, terminated) == (1.0, True)


def test_steps_style_asks_for_work_and_accepts_the_reference_solution():
    env = ArithmeticEnv(answer_style="steps", ops=["*"], num_digits=3)
    obs, info = env.reset(seed=3)
    assert "step by step" in obs and "Answer:" in env.system_prompt
    assert len(info["solution"].splitlines()) >= 3  # decode-heavy: several lines of work
    _, reward, *_ = env.step(info["solution"])
    assert reward == 1.0


def test_worked_steps_end_with_the_true_result():
    rng = random.Random(0)
    for _ in range(300):
        a, b = rng.randrange(0, 10**5), rng.randrange(0, 10**5)
        op = rng.choice("+-*")
        steps = worked_steps(a, op, b)
        assert steps.splitlines()[-1] == f"Answer: {_truth(f'{a}{op}{b}')}"
        assert parse_final_number(steps) == _truth(f"{a}{op}{b}")


def test_option_seed_makes_the_first_unseeded_reset_reproducible():
    first = [ArithmeticEnv(seed=5).reset()[1]["question"] for _ in range(2)]
    assert first[0] == first[1]
    questions = {ArithmeticEnv().reset(seed=s)[1]["question"] for s in range(10)}
    assert len(questions) > 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("82", 82),
        ("so 37+45 = 82.", 82),
        ("1,665", 1665),
        ("it is -8", -8),
        ("2.50", 2.5),
        ("3.0", 3),
        ("no digits", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_final_number(text, expected):
    assert parse_final_number(text) == expected


def test_answer_tokens_partial_credit_and_operand_range():
    from rollart_env_arithmetic.env import ArithmeticEnv

    env = ArithmeticEnv(num_digits=1, ops=["+"], max_operand=4, answer_tokens=True,
                        partial_credit=True)
    assert env.action_vocabulary == [str(i) for i in range(9)]  # 0+0 .. 4+4
    seen = set()
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        a, b = (int(x) for x in info["question"].split("+"))
        assert 0 <= a <= 4 and 0 <= b <= 4
        seen.add((a, b))
        truth = a + b
        wrong = (truth + 2) % 9
        _, r, done, _, info = env.step(str(wrong))
        assert done and not info["success"]
        assert r == pytest.approx(1 - abs(wrong - truth) / 8)
        env.reset(seed=seed)
        _, r, _, _, info = env.step(str(truth))
        assert r == 1.0 and info["success"]
    assert len(seen) > 10
    # Without partial credit a wrong answer scores 0, and the vocabulary stays free text.
    plain = ArithmeticEnv(num_digits=1, ops=["+"])
    assert plain.action_vocabulary is None
    plain.reset(seed=0)
    assert plain.step("-1")[1] == 0.0


def test_options_reject_out_of_range_operand():
    from pydantic import ValidationError
    from rollart_env_arithmetic.env import ArithmeticOptions

    with pytest.raises(ValidationError, match="max_operand"):
        ArithmeticOptions(num_digits=2, max_operand=5)
    with pytest.raises(ValidationError, match="more than 512"):
        ArithmeticOptions(num_digits=3, ops=["*"], answer_tokens=True)
