"""Rule-based reward: scores a finished trajectory from its text and the env's info.

Four modes, one per common source of truth:

- ``env_return``: the sum of the env's step rewards (the env already knows the score);
- ``success``: 1 when the env's last ``info["success"]`` is true (e.g. FrozenLake goal);
- ``exact_match``: the final response against ``info["answer"]`` (the env's ground truth):
  numbers compare by value (the last number in the response), text by stripped,
  case-folded equality;
- ``regex``: 1 when ``pattern`` is found in the final response.

``reward = scale * raw - (format_penalty if the format is off)``. The format is off when
``pattern`` is set (in a mode other than ``regex``) and the final response does not match
it, when ``exact_match`` needs a number and the response has none, or when the env
flagged the last action invalid (``info["invalid_action"]``). ``details`` says which.
The backend keeps no state between calls, so concurrent ``score`` calls are safe.

``pattern`` runs with the ``regex`` package (its ``V0`` syntax: that of Python's ``re``)
bounded by ``pattern_timeout_s`` per search: a user pattern that backtracks
catastrophically on some response (``(a|aa)+$`` on forty a's and a b: Python's ``re``
would take hours) fails that trajectory's score with the reason instead of freezing the
process that scores it (in-process, the control plane's event loop).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollart_sdk.types import RewardRequest, RewardResult

Mode = Literal["env_return", "exact_match", "regex", "success"]
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


class RuleRewardOptions(BaseModel):
    """Options of reward ``rule`` (``tasks[].reward.options`` in a run config)."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = Field("env_return", description=(
        "where the score comes from: env_return (sum of the env's step rewards), success "
        "(1 when the last info['success'] is true), exact_match (final response vs "
        "info['answer']: numbers by value, text case-folded), regex (1 when pattern is "
        "found in the final response)"))
    pattern: str | None = Field(
        None, description="regex: in mode 'regex' the reward test, otherwise a format check"
    )
    scale: float = Field(1.0, description="multiplies the raw 0/1 (or env return) score")
    format_penalty: float = Field(
        0.0, ge=0.0, description="subtracted when the final response's format is off"
    )
    pattern_timeout_s: float = Field(
        1.0, gt=0.0, le=60.0,
        description="the longest one search of pattern may take; past it the score fails",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                regex.compile(pattern, flags=regex.V0)
            except regex.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return pattern

    @field_validator("scale")
    @classmethod
    def _finite(cls, scale: float) -> float:
        if not math.isfinite(scale):
            raise ValueError("scale must be a finite number")
        return scale

    @model_validator(mode="after")
    def _regex_needs_pattern(self) -> RuleRewardOptions:
        if self.mode == "regex" and not self.pattern:
            raise ValueError("mode 'regex' needs a pattern, e.g. pattern: 'Answer: \\d+'")
        return self


def last_number(text: str) -> float | None:
    """The value of the last number written in ``text`` ("= 1,665." -> 1665.0), or None."""
    matches = _NUMBER_RE.findall(text)
    return float(matches[-1].replace(",", "")) if matches else None


def _as_number(answer: Any) -> float | None:
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        return float(answer)
    if isinstance(answer, str) and _NUMBER_RE.fullmatch(answer.strip()):
        return float(answer.strip().replace(",", ""))
    return None


class RuleReward:
    """Reward backend ``rule``. Factory call: ``RuleReward(**RuleRewardOptions)``."""

    def __init__(
        self,
        mode: Mode = "env_return",
        pattern: str | None = None,
        scale: float = 1.0,
        format_penalty: float = 0.0,
        pattern_timeout_s: float = 1.0,
    ) -> None:
        self.options = RuleRewardOptions(
            mode=mode, pattern=pattern, scale=scale, format_penalty=format_penalty,
            pattern_timeout_s=pattern_timeout_s,
        )
        self._regex = regex.compile(pattern, flags=regex.V0) if pattern else None

    def _search(self, request: RewardRequest, text: str) -> Any:
        """``pattern`` searched in ``text``, at most ``pattern_timeout_s``."""
        assert self._regex is not None
        limit = self.options.pattern_timeout_s
        try:
            return self._regex.search(text, timeout=limit)
        except TimeoutError:
            raise ValueError(
                f"reward 'rule': pattern {self.options.pattern!r} did not finish searching "
                f"trajectory {request.trajectory_id!r}'s final response ({len(text)} "
                f"characters) within pattern_timeout_s={limit:g}: it backtracks "
                "catastrophically (nested or overlapping repetition such as (a+)+ or "
                "(a|aa)+). Rewrite it without nested repetition, or raise "
                "tasks[].reward.options.pattern_timeout_s."
            ) from None

    def _missing(self, request: RewardRequest, key: str, fix: str) -> ValueError:
        return ValueError(
            f"reward 'rule' (mode {self.options.mode}): trajectory {request.trajectory_id!r} "
            f"(tag {request.tag!r}) has no info[{key!r}] from its env. {fix}"
        )

    async def score(self, request: RewardRequest) -> RewardResult:
        opts = self.options
        final = request.responses[-1] if request.responses else ""
        problems: list[str] = []
        details: dict[str, Any] = {"mode": opts.mode}

        if opts.mode == "env_return":
            raw = float(request.env_return)
            why = f"env return {raw:g}"
        elif opts.mode == "success":
            if "success" not in request.info:
                raise self._missing(
                    request, "success", "Use mode env_return, or an env that reports success."
                )
            raw = 1.0 if request.info["success"] else 0.0
            why = "env reported success" if raw else "env reported no success"
        elif opts.mode == "exact_match":
            if "answer" not in request.info:
                raise self._missing(
                    request,
                    "answer",
                    "Exact match needs an env that puts its ground truth in info['answer'] "
                    "(e.g. env 'arithmetic'); otherwise use mode env_return or success.",
                )
            answer = request.info["answer"]
            expected = _as_number(answer)
            if expected is not None:
                got: Any = last_number(final)
                if got is None:
                    problems.append("no number in the final response")
                raw = 1.0 if got is not None and math.isclose(got, expected, abs_tol=1e-9) else 0.0
            else:
                got = final.strip()
                raw = 1.0 if got.casefold() == str(answer).strip().casefold() else 0.0
            details.update(expected=answer, got=got)
            why = f"final answer {got!r} {'matches' if raw else 'does not match'} {answer!r}"
        else:  # regex
            assert self._regex is not None  # guaranteed by the options model
            match = self._search(request, final)
            raw = 1.0 if match else 0.0
            details["match"] = match.group(0) if match else None
            why = f"pattern {opts.pattern!r} {'found' if match else 'not found'} in final response"

        if self._regex is not None and opts.mode != "regex" and not self._search(request, final):
            problems.append(f"final response does not match pattern {opts.pattern!r}")
        if request.info.get("invalid_action"):
            problems.append("the env flagged the last action as invalid")

        penalty = opts.format_penalty if problems else 0.0
        reward = raw * opts.scale - penalty
        details.update(
            raw=raw,
            scale=opts.scale,
            format_ok=not problems,
            format_problems=problems,
            penalty=penalty,
            explanation=f"{why}: {raw:g} x {opts.scale:g}"
            + (f" - {penalty:g} format penalty" if penalty else "")
            + f" = {reward:g}",
        )
        return RewardResult(trajectory_id=request.trajectory_id, reward=reward, details=details)
