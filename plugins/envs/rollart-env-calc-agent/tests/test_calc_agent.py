"""Env calc_agent without a model: its task, calculator, answer parsing and options."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rollart_env_calc_agent.env import (
    CalcAgentEnv,
    CalcAgentOptions,
    calculate,
    final_number,
    is_bare_number,
)


def test_tasks_are_seeded_questions_with_their_answers() -> None:
    env = CalcAgentEnv(low=2, high=5, ops=["*"])
    task = env.task(7)
    assert task == env.task(7)  # a GRPO group shares the seed, hence the question
    a, b = (int(x) for x in task["question"][len("What is "):-1].split(" * "))
    assert 2 <= a <= 5 and 2 <= b <= 5 and task["answer"] == str(a * b)
    text, info = env.reset(seed=7)
    assert info["answer"] == task["answer"] and task["question"] in text


def test_the_calculator_evaluates_arithmetic_and_nothing_else() -> None:
    assert calculate("12 * (3 + 4)") == "84"
    assert calculate(" 7 - 9 ") == "-2" and calculate("7 / 2") == "3.5"
    assert calculate("8 / 2") == "4" and calculate("-(2 + 3) % 4") == "3"
    assert calculate("1 / 0").startswith("error:")
    assert calculate("__import__('os').getcwd()").startswith("error: only numbers")
    assert calculate("2 ** 8").startswith("error: only numbers")  # no power: no huge numbers
    assert calculate("9" * 31).startswith("error: result too large")


def test_answers_are_read_from_the_last_number() -> None:
    assert final_number("2 + 3 = 5, so the answer is 5.") == "5"
    assert final_number("-12") == "-12" and final_number("1,234") == "1234"
    assert final_number("4.0") == "4" and final_number("no number") is None
    assert is_bare_number(" 5. ") and is_bare_number("-3")
    assert not is_bare_number("The answer is 5") and not is_bare_number("")


def test_bad_options_say_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match="ops must be"):
        CalcAgentOptions(ops=["^"])
    with pytest.raises(ValidationError, match="high"):
        CalcAgentOptions(low=5, high=2)
    with pytest.raises(ValidationError, match="extra"):
        CalcAgentOptions(digits=3)
    with pytest.raises(ValidationError, match="tool_choice must be one of auto, required"):
        CalcAgentOptions(tool_choice="search")
    assert CalcAgentOptions(tool_choice="required").tool_choice == "required"


def test_the_plugin_registers_an_agent_env_that_needs_the_sdk() -> None:
    from rollart_sdk.plugins import get_plugins

    desc = get_plugins().registry.get("env", "calc_agent")
    assert desc.requires == {"agents": desc.requires["agents"]}
    assert "openai-agents" in desc.requires["agents"]
    assert CalcAgentEnv().is_agent
