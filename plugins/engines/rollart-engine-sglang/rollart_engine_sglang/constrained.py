"""Constrained actions (``allowed_token_ids``) on SGLang 0.5.23, which has no such option.

A ``logit_bias`` of -inf on every other id would constrain SGLang's sampling, but SGLang
adds the bias before it computes log-probs, and a bias of -inf also leaves the engine
with no control over what the reported number means. Instead, one token at a time:
SGLang runs the step greedily without any bias and reports, through
``token_ids_logprob``, the full-vocabulary log-prob of each allowed id at that position
(a greedy request runs at temperature 1 in SGLang, so these are the raw logits minus one
constant); the adapter samples among the allowed ids from those log-probs (temperature,
top-k, top-p as the torch engine applies them after its mask) with the request's own
generator, and reports the chosen id's log-prob under the sampled policy,
``log_softmax(logits[allowed] / T)`` (:mod:`rollart_sdk.algorithms.policy`): exactly what
the trainer recomputes. SGLang's own token for that step is discarded. A constrained
request of ``n`` tokens is ``n`` SGLang requests (each a one-token extend over the
radix-cached prefix); RL actions are one token (the pipeline asks for
``max_new_tokens=1`` with allowed ids), so the training workload pays nothing extra. As a
side effect a constrained request's seed is honoured on every SGLang backend (the
sampling happens here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rollart_sdk.algorithms import draw, policy_temperature
from rollart_sdk.types import SamplingParams


def allowed_logprobs(meta: dict[str, Any], allowed: Sequence[int]) -> list[float] | None:
    """The full-vocabulary log-probs of ``allowed`` at the first output position of a
    one-token SGLang request made with ``token_ids_logprob=allowed``, in that order; None
    when the chunk does not carry them yet (SGLang streams them with the token)."""
    rows = meta.get("output_token_ids_logprobs") or []
    if not rows or not rows[0]:
        return None
    by_id = {int(entry[1]): float(entry[0]) for entry in rows[0]}
    missing = [t for t in allowed if t not in by_id]
    if missing:
        raise RuntimeError(
            f"SGLang returned token_ids_logprob for {sorted(by_id)[:8]} but not for the "
            f"allowed ids {missing[:8]}; cannot sample the constrained action"
        )
    return [by_id[t] for t in allowed]


def choose_allowed(logprobs: Sequence[float], allowed: Sequence[int], params: SamplingParams,
                   generator: torch.Generator) -> int:
    """Pick one of ``allowed`` from their full-vocabulary ``logprobs`` under ``params``.

    The same rule as the torch engine after its allowed-ids mask (both call the core's
    ``rollart_sdk.algorithms.draw``): argmax at temperature 0, else divide by the
    temperature, keep the top-k, then the smallest prefix whose mass reaches top-p (at
    least one), and draw. The log-probs differ from the logits by one constant per
    position, so the distribution is the same.
    """
    x = torch.tensor(list(logprobs), dtype=torch.float64)
    return int(allowed[draw(x, params, generator)])


def allowed_policy_logprob(logprobs: Sequence[float], index: int, temperature: float) -> float:
    """The log-prob of ``allowed[index]`` under the sampled policy, from the allowed ids'
    full-vocabulary ``logprobs`` (raw logits minus one constant, which cancels):
    ``log_softmax(logprobs / T)[index]``, greedy taken as temperature 1."""
    x = torch.tensor(list(logprobs), dtype=torch.float64) / policy_temperature(temperature)
    return float(x[index] - torch.logsumexp(x, dim=0))
