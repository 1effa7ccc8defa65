"""Warnings a run prints once when its metrics show the policy has gone wrong in a way
the reward curve hides (issue #38).

:class:`MismatchWatch`: the trainer's log-probs of fresh tokens far from the engine's
(the trained policy is not the sampled one).

:class:`ActionWatch`: where a task's actions are constrained (``constrain_actions``), the
probability mass the unmasked policy puts on the allowed tokens (``allowed_mass/<task>``
from the trainer; ``train/allowed_mass_mean`` from a trainer that does not split it by
task). Below ``ALLOWED_MASS_WARN`` and below ``UNIFORM_FACTOR`` times the share a
policy without any preference would give the actions (``allowed_mass_uniform/<task>``:
allowed ids / vocabulary; a model trained from scratch starts near it, and is not
warned about), the model's own preference is a token outside the action vocabulary:
the constrained sampler then draws from the tail of its distribution, whatever the
observation, and the run cannot learn from the feedback, while the entropy of the masked
policy looks like convergence.
"""

from __future__ import annotations

import math
from typing import Any

ALLOWED_MASS_WARN = 0.05
UNIFORM_FACTOR = 0.5


class ActionWatch:
    """``check(metrics)`` after every step's metrics line: the warnings to print, each at
    most once per task per run."""

    def __init__(self, threshold: float | None = None, factor: float | None = None) -> None:
        self.threshold = ALLOWED_MASS_WARN if threshold is None else threshold
        self.factor = UNIFORM_FACTOR if factor is None else factor
        self.warned: set[str] = set()

    def check(self, metrics: dict[str, Any]) -> list[str]:
        per_task = {k.split("/", 1)[1]: v for k, v in metrics.items()
                    if k.startswith("allowed_mass/")}
        if not per_task and "train/allowed_mass_mean" in metrics:
            per_task = {"(all constrained tasks)": metrics["train/allowed_mass_mean"]}
        out = []
        for tag, value in sorted(per_task.items()):
            if tag in self.warned or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value) or value >= self.threshold:
                continue
            share = metrics.get(f"allowed_mass_uniform/{tag}")
            if isinstance(share, (int, float)) and value >= self.factor * share:
                continue  # no worse than no preference at all (a model from scratch)
            self.warned.add(tag)
            baseline = (f"; a policy with no preference would put {share:.2g} there"
                        if isinstance(share, (int, float)) else "")
            shown = f"{value:.2g}" if value >= 1e-30 else "less than 1e-30"
            out.append(
                f"task {tag}: at step {metrics.get('step', '?')} the policy puts "
                f"{shown} of its probability on the allowed action tokens (below "
                f"{self.threshold:g}{baseline}): the model prefers tokens outside the "
                "action vocabulary, so the constrained sampler draws from the tail of its "
                "distribution and ignores the observations. Check the prompt "
                "(system_prompt, prompt_format: does it ask for one of the action words?) "
                f"and the model; allowed_mass/{tag} in metrics.jsonl follows it")
        return out


MISMATCH_WARN = 0.1  # nats per token: above kernel and bf16 noise (1e-6 fp32, ~3e-2 bf16)


class MismatchWatch:
    """``check(metrics)`` after every step: a warning, once per engine per run, when the
    trainer's log-probs of tokens sampled with its own current weights differ from the
    engine's by ``MISMATCH_WARN`` nats or more on average (``train/mismatch_mean``, per
    engine ``train/mismatch_mean/<worker>``; :class:`~rollart_sdk.algorithms.policy.
    MismatchMeter`). Then the trained policy is not the sampled one: a different
    distribution (template, sampling rule, masking, weights), not rounding."""

    def __init__(self, threshold: float = MISMATCH_WARN) -> None:
        self.threshold = threshold
        self.warned: set[str] = set()

    def check(self, metrics: dict[str, Any]) -> list[str]:
        per_engine = {k.split("/", 2)[2]: v for k, v in metrics.items()
                      if k.startswith("train/mismatch_mean/")}
        if not per_engine and "train/mismatch_mean" in metrics:
            per_engine = {"": metrics["train/mismatch_mean"]}
        out = []
        for name, value in sorted(per_engine.items()):
            if (name in self.warned or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < self.threshold):
                continue
            self.warned.add(name)
            who = f"engine {name}'s" if name else "the engines'"
            key = f"train/mismatch_mean/{name}" if name else "train/mismatch_mean"
            top = metrics.get(f"train/mismatch_max/{name}" if name else "train/mismatch_max")
            worst = f", at most {top:.2g}" if isinstance(top, (int, float)) else ""
            out.append(
                f"at step {metrics.get('step', '?')} the trainer's log-probs differ from "
                f"{who} by {value:.2g} nats per token on average{worst}, on tokens "
                "sampled with the weights being trained (kernel and bf16 rounding give "
                f"below {self.threshold:g}): the trained policy is not the sampled one. "
                "Check what the engine applies that the trainer does not (chat template, "
                "sampling settings, constrained actions, a model or dtype of its own); "
                f"{key} in metrics.jsonl and policy.png (rollart report RUN) follow it")
        return out
