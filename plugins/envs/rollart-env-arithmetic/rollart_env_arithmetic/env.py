"""Arithmetic questions as a text environment: short prompts, long free-text answers.

The point of this env is load, not difficulty: with ``answer_style: steps`` the policy
writes one line per partial result, so each episode is decode-heavy (many generated
tokens for a short prompt), the regime ROLLART's rollout side has to keep busy. The
ground truth is in ``info["answer"]`` so a rule reward can check it independently.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, model_validator

Op = Literal["+", "-", "*"]
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_CHARSET = string.printable


class ArithmeticOptions(BaseModel):
    """Options of env ``arithmetic`` (``tasks[].env.options`` in a run config)."""

    model_config = ConfigDict(extra="forbid")

    num_digits: int = Field(2, ge=1, le=12, description="digits of each operand")
    ops: list[Op] = Field(
        default_factory=lambda: list[Op](["+", "-"]), min_length=1,
        description="operators to draw from"
    )
    seed: int | None = Field(
        None, description="seeds the first reset() that is given no seed (reproducible runs)"
    )
    answer_style: Literal["number", "steps"] = Field(
        "number", description="'number': just the result; 'steps': worked steps, then the result"
    )
    turns: int = Field(1, ge=1, le=16, description="attempts per question before the episode ends")
    max_operand: int | None = Field(
        None, ge=0, description="draw operands from low..max_operand instead of every "
                                "num_digits number (a smaller table to learn)")
    answer_tokens: bool = Field(
        False, description="expose every possible result as the action vocabulary, so that "
                           "a task with constrain_actions: true answers with one result token")
    partial_credit: bool = Field(
        False, description="env reward 1 - |answer - truth| / (range of results) for a wrong "
                           "number (1 only when exact; success stays exact): a dense signal "
                           "for a policy trained from scratch")

    @model_validator(mode="after")
    def _ranges(self) -> ArithmeticOptions:
        low = 0 if self.num_digits == 1 else 10 ** (self.num_digits - 1)
        if self.max_operand is not None and not low <= self.max_operand < 10**self.num_digits:
            raise ValueError(f"max_operand ({self.max_operand}) must be a {self.num_digits}-digit "
                             f"number (>= {low}, < {10**self.num_digits})")
        if self.answer_tokens and len(possible_results(self)) > 512:
            raise ValueError(f"answer_tokens: {len(possible_results(self))} possible results, "
                             "more than 512 action words; lower num_digits or max_operand")
        return self


def operand_range(o: ArithmeticOptions) -> tuple[int, int]:
    """(lowest, highest) operand."""
    low = 0 if o.num_digits == 1 else 10 ** (o.num_digits - 1)
    high = o.max_operand if o.max_operand is not None else 10**o.num_digits - 1
    return low, high


def possible_results(o: ArithmeticOptions) -> list[int]:
    low, high = operand_range(o)
    return sorted({_apply(a, op, b) for op in o.ops for a in range(low, high + 1)
                   for b in range(low, high + 1)})


def parse_final_number(text: Any) -> int | float | None:
    """The last number written in ``text`` ("so 37+45 = 82." -> 82), or None.

    Thousands separators are accepted ("1,665"); a decimal with a zero fraction is an int.
    """
    if not isinstance(text, str):
        return None
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    raw = matches[-1].replace(",", "")
    if "." not in raw:
        return int(raw)
    value = float(raw)
    return int(value) if value.is_integer() else value


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b


def _place_parts(b: int) -> list[int]:
    """45 -> [40, 5]; 105 -> [100, 5]; 0 -> [0]."""
    digits = str(b)
    parts = [int(d) * 10 ** (len(digits) - i - 1) for i, d in enumerate(digits) if d != "0"]
    return parts or [0]


def worked_steps(a: int, op: str, b: int) -> str:
    """The reference written solution: the second operand split by place value.

    ``37*45`` -> ``37 * 40 = 1480 / 37 * 5 = 185 / 1480 + 185 = 1665 / Answer: 1665``
    (one line each).
    """
    lines: list[str] = []
    parts = _place_parts(b)
    if op in "+-":
        acc = a
        for part in parts:
            nxt = _apply(acc, op, part)
            lines.append(f"{acc} {op} {part} = {nxt}")
            acc = nxt
    else:
        products = []
        for part in parts:
            products.append(a * part)
            lines.append(f"{a} * {part} = {a * part}")
        acc = products[0]
        for p in products[1:]:
            lines.append(f"{acc} + {p} = {acc + p}")
            acc += p
    lines.append(f"Answer: {acc}")
    return "\n".join(lines)


class ArithmeticEnv(gymnasium.Env):
    """``Compute 37+45.`` -> the policy answers in free text -> reward 1.0 if right.

    ``step(text)`` reads the last number in ``text``; a correct one ends the episode with
    reward 1.0, a wrong one gives 0.0 and ends it once ``turns`` attempts are used. A
    reply without a number counts as a wrong attempt with ``info["invalid_action"]``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_vocabulary: list[str] | None = None

    def __init__(self, render_mode: str | None = None, **options: Any) -> None:
        self.options = ArithmeticOptions(**options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'ansi' or None")
        self.render_mode = render_mode
        results = possible_results(self.options) if (self.options.answer_tokens
                                                      or self.options.partial_credit) else []
        self._span = max(1, results[-1] - results[0]) if results else 1
        if self.options.answer_tokens:
            self.action_vocabulary = [str(r) for r in results]
        self.observation_space = spaces.Text(max_length=4096, min_length=1, charset=_CHARSET)
        self.action_space = spaces.Text(max_length=8192, min_length=0, charset=_CHARSET)
        self.system_prompt = (
            "You are a careful calculator. Solve the arithmetic problem you are given."
            + (
                " Show your work one partial result per line, then finish with a line "
                "'Answer: <number>'."
                if self.options.answer_style == "steps"
                else " Reply with the result only."
            )
        )
        self._first_reset = True
        self._question: tuple[int, str, int] | None = None
        self._answer = 0
        self._attempts = 0
        self._done = False
        self._obs = ""

    @property
    def question(self) -> str:
        if self._question is None:
            return ""
        a, op, b = self._question
        return f"{a}{op}{b}"

    def _prompt(self) -> str:
        if self.options.answer_style == "steps":
            a, op, b = self._question or (0, "+", 0)
            split = " + ".join(str(p) for p in _place_parts(b))
            return (
                f"Compute {self.question}. Work it out step by step: split {b} by place value "
                f"({b} = {split}), write one line per partial result, and end with "
                "'Answer: <number>'."
            )
        return f"Compute {self.question}. Answer with the number."

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        if seed is None and self._first_reset:
            seed = self.options.seed
        self._first_reset = False
        super().reset(seed=seed)
        low, high = operand_range(self.options)
        a = int(self.np_random.integers(low, high + 1))
        b = int(self.np_random.integers(low, high + 1))
        op = self.options.ops[int(self.np_random.integers(0, len(self.options.ops)))]
        self._question = (a, op, b)
        self._answer = _apply(a, op, b)
        self._attempts = 0
        self._done = False
        self._obs = self._prompt()
        return self._obs, self._info(parsed=None, success=False, invalid=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._question is None:
            raise RuntimeError("ArithmeticEnv.step called before reset(); call reset() first")
        if self._done:
            raise RuntimeError("ArithmeticEnv: the episode is over; call reset() first")
        self._attempts += 1
        parsed = parse_final_number(action)
        success = parsed is not None and parsed == self._answer
        terminated = success or self._attempts >= self.options.turns
        self._done = terminated
        if success:
            self._obs = "Correct."
        elif terminated:
            self._obs = f"Wrong. The answer was {self._answer}."
        else:
            said = "no number" if parsed is None else f"{parsed} is wrong"
            left = self.options.turns - self._attempts
            self._obs = f"Not quite: {said}. {left} attempt(s) left. {self._prompt()}"
        info = self._info(parsed=parsed, success=success, invalid=parsed is None)
        reward = 1.0 if success else 0.0
        if self.options.partial_credit and parsed is not None and not success:
            reward = max(0.0, 1.0 - abs(parsed - self._answer) / self._span)
        return self._obs, reward, terminated, False, info

    def _info(self, parsed: int | float | None, success: bool, invalid: bool) -> dict[str, Any]:
        a, op, b = self._question or (0, "+", 0)
        return {
            "answer": str(self._answer),
            "question": self.question,
            "solution": worked_steps(a, op, b),
            "parsed": parsed,
            "success": success,
            "invalid_action": invalid,
            "attempts": self._attempts,
        }

    def render(self) -> str | None:
        return self._obs if self.render_mode == "ansi" else None
