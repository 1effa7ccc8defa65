"""An OpenAI Agents SDK agent with a calculator tool, as a rollart agent env.

The agent is the Agents SDK itself, unmodified (``pip install openai-agents``): an
``Agent`` with one function tool, ``calculator(expression)``, on an
``OpenAIChatCompletionsModel`` (option ``api: chat_completions``) or the SDK's default
``OpenAIResponsesModel`` (``api: responses``) over the episode's ``openai.AsyncOpenAI``
client (the gateway serves both APIs from the run's engines, docs/gateway.md). The task
is an arithmetic question (``a op b``); the reward is 1 when the last number of the
agent's final answer is the right result, else 0. When the final answer is not a bare
number, the agent is asked again (``follow_ups`` times) with the conversation so far: the
request extends the previous one, so the gateway continues the same segment (when the
chat template renders the model's reply as the model wrote it). The model's own failures
(a reply the SDK refuses, too many turns) score 0 and are trained (``on_error``).
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollart_sdk.gateway import AgentEnv, AgentResult

INSTRUCTIONS = ("You are a calculator assistant. Call the calculator tool with the "
                "arithmetic expression, then reply with the resulting number only.")
FOLLOW_UP = "Reply with the resulting number only."
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BARE = re.compile(r"\s*-?\d+(?:\.\d+)?\s*\.?\s*")  # a reply that is a number only
TOOL_CHOICES = ("auto", "required", "none", "calculator")
APIS = ("chat_completions", "responses")
# The gateway's refusals for an episode that ran past the task's limits: the model's doing.
MODEL_LIMITS = ("max_turns_exceeded", "context_length_exceeded")
MAX_DIGITS = 30  # the calculator refuses results longer than this (e.g. 9*9*...)


class CalcAgentOptions(BaseModel):
    """Options of env ``calc_agent``."""

    model_config = ConfigDict(extra="forbid")

    low: int = Field(0, description="smallest operand")
    high: int = Field(20, description="largest operand")
    ops: list[str] = Field(default_factory=lambda: ["+", "-", "*"],
                           description="operators the questions use: any of + - *")
    instructions: str = Field(INSTRUCTIONS, description="the Agent's instructions (its "
                              "system message)")
    follow_ups: int = Field(1, ge=0, le=4, description="times the agent is asked again when "
                            "its final answer is not a number only")
    sdk_max_turns: int = Field(4, ge=1, description="the Agents SDK's max_turns per run "
                               "(model calls of one Runner.run)")
    max_tokens: int | None = Field(None, ge=1, description="max_tokens of each request; "
                                   "None: the task's sampling.max_new_tokens")
    api: str = Field("chat_completions", description="the OpenAI API the Agent's model "
                     "speaks: chat_completions (OpenAIChatCompletionsModel) or responses "
                     "(OpenAIResponsesModel, the Agents SDK's default)")
    tool_parser: str = Field("auto", description="how the model's text becomes tool calls: "
                             "auto (from the chat template), hermes, llama3_json, mistral")
    tool_choice: str | None = Field(None, description="the Agent's ModelSettings.tool_choice: "
                                    "auto, required (the first model call of each Runner.run "
                                    "must call the tool: the gateway forces its opening as "
                                    "prompt tokens), none, or calculator (the tool by name); "
                                    "None: not sent")

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, v: str | None) -> str | None:
        if v is not None and v not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} (or "
                             f"unset), got {v!r}")
        return v

    @field_validator("api")
    @classmethod
    def _api(cls, v: str) -> str:
        if v not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {v!r}")
        return v

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: list[str]) -> list[str]:
        bad = [op for op in v if op not in OPS]
        if not v or bad:
            raise ValueError(f"ops must be a non-empty list of {sorted(OPS)}, got {v!r}")
        return v

    @field_validator("high")
    @classmethod
    def _range(cls, v: int, info: Any) -> int:
        low = info.data.get("low", 0)
        if v < low:
            raise ValueError(f"high ({v}) must be at least low ({low})")
        return v


def calculate(expression: str) -> str:
    """The tool: an arithmetic expression (numbers, + - * / // %, parentheses) evaluated
    without ``eval``; what is wrong with it, as text, otherwise."""
    try:
        value = _eval(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value)
    return text if len(text) <= MAX_DIGITS else "error: result too large"


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        return float(_BIN[type(node.op)](_eval(node.left), _eval(node.right)))
    raise ValueError(f"only numbers and + - * / // % are allowed, not {ast.dump(node)[:40]}")


def final_number(text: str) -> str | None:
    """The last number in ``text`` (integers as written, ``5.0`` as ``5``), or None."""
    found = _NUMBER.findall(text.replace(",", ""))
    if not found:
        return None
    value = float(found[-1])
    return str(int(value)) if value.is_integer() else found[-1]


def is_bare_number(text: str) -> bool:
    """The reply is a number and nothing else (a trailing period allowed)."""
    return _BARE.fullmatch(text.replace(",", "")) is not None


class CalcAgentEnv(AgentEnv):
    """Env ``calc_agent``: the Agents SDK agent above, one arithmetic question per episode
    (a GRPO group shares the seed, hence the question)."""

    def __init__(self, **options: Any) -> None:
        self.options = CalcAgentOptions(**options)
        self.tool_parser = self.options.tool_parser

    def task(self, seed: int) -> dict[str, Any]:
        o = self.options
        rng = random.Random(seed)
        a, b = rng.randint(o.low, o.high), rng.randint(o.low, o.high)
        op = rng.choice(o.ops)
        return {"question": f"What is {a} {op} {b}?", "answer": str(OPS[op](a, b))}

    async def run(self, client: Any, task: Any) -> AgentResult:
        from agents import (
            ModelSettings,
            OpenAIChatCompletionsModel,
            OpenAIResponsesModel,
            RunConfig,
            Runner,
        )

        kind = OpenAIResponsesModel if self.options.api == "responses" \
            else OpenAIChatCompletionsModel
        agent = self._agent(kind(model=self.model, openai_client=client),
                            ModelSettings(max_tokens=self.options.max_tokens,
                                          tool_choice=self.options.tool_choice))
        config = RunConfig(tracing_disabled=True)
        result = await Runner.run(agent, task["question"], max_turns=self.options.sdk_max_turns,
                                  run_config=config)
        asked = 0
        while not is_bare_number(str(result.final_output)) and asked < self.options.follow_ups:
            asked += 1
            more: list[Any] = [*result.to_input_list(), {"role": "user", "content": FOLLOW_UP}]
            result = await Runner.run(agent, more, max_turns=self.options.sdk_max_turns,
                                      run_config=config)
        answer = str(result.final_output)
        calls = sum(1 for item in result.to_input_list()
                    if isinstance(item, dict) and item.get("type") == "function_call")
        correct = final_number(answer) == task["answer"]
        return AgentResult(reward=float(correct), answer=answer,
                           info={"calculator_calls": calls, "follow_ups": asked})

    def on_error(self, exc: Exception) -> AgentResult | None:
        """The model's own failures score 0 and are trained: a reply the SDK refuses
        (``ModelBehaviorError``: cut by the token limit on the Responses API, a call to a
        tool the agent does not have), model calls past ``sdk_max_turns``, or past what
        the task allows (the gateway's 400 ``max_turns_exceeded`` /
        ``context_length_exceeded``). Anything else (the gateway ended the episode,
        another refused request) drops the episode."""
        import openai
        from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

        if isinstance(exc, (ModelBehaviorError, MaxTurnsExceeded)) or (
                isinstance(exc, openai.BadRequestError) and exc.code in MODEL_LIMITS):
            return AgentResult(reward=0.0, answer="")
        return None

    def _agent(self, model: Any, settings: Any) -> Any:
        from agents import Agent, function_tool

        @function_tool
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression such as "12 * (3 + 4)".

            Args:
                expression: the expression, with numbers and + - * / // % ( ).
            """
            return calculate(expression)

        return Agent(name="calculator", instructions=self.options.instructions,
                     tools=[calculator], model=model, model_settings=settings)
