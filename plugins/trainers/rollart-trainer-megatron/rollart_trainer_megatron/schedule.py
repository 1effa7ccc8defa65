"""The forward/backward of one step of trainer ``megatron``, driven by megatron-core's
own schedules (``get_forward_backward_func``): ``forward_backward_no_pipelining`` at
PP = 1, the 1F1B ``forward_backward_pipelining_without_interleaving`` at PP > 1.

Each micro-batch is a packed block of rows (packing.py); every stage reads the same
micro-batches (positions and the block-diagonal mask are needed by every layer), the first
stage embeds the tokens, the last computes the loss with :mod:`rollart_sdk.algorithms`.
Shapes differ between micro-batches, so the schedule runs with
``variable_seq_lengths=True`` (activations' shapes are sent ahead of them) and
``calculate_per_token_loss=True``, which makes the schedule use each micro-batch's loss as
returned: it is already divided by the whole-batch normaliser, so the accumulated
gradient is the full-batch gradient. The schedule's own gradient finalisation
(``finalize_model_grads_func``) is left unset: the trainer reduces gradients itself.

On CPU the schedules run under :class:`~rollart_trainer_megatron.pipeline.CudaToCpu`
(they allocate a token counter with ``device="cuda"``); point-to-point transfers are
gloo ``isend`` / ``irecv`` (``batch_p2p_comm=False``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from rollart_sdk.algorithms import policy_token_logprobs
from rollart_sdk.backends.objective import MAXIMA, SUMS, LossStats, decoupled_ppo_objective
from rollart_trainer_megatron.packing import pack
from rollart_trainer_megatron.pipeline import device_mode

# Beside the objective's (rollart_sdk.backends.objective.LossStats): constrained tasks'
# mass on the allowed ids; allowed_gap: 1 - the smallest allowed mass of a constrained
# position (a max reduces it).
EXTRA_SUMS = ("allowed_mass", "allowed_rows")
EXTRA_MAXES = ("allowed_gap",)
METRIC_SUMS = (*SUMS, *EXTRA_SUMS)
METRIC_MAXES = (*MAXIMA, *EXTRA_MAXES)
_KEYS = ("ids", "positions", "mask", "loss_mask", "behaviour", "versions", "advantages",
         "seq_weight")


def forward_backward(trainer: Any, batch: list[Any], plan: list[list[list[int]]],
                     normalizer: float) -> LossStats:
    """Forward and backward over every micro-batch of ``plan``; gradients accumulate in
    the parameters. Returns this stage's metric sums and maxima (zeros except on the last
    stage)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    micro = []
    for rows in plan:
        p = pack([[batch[i] for i in row] for row in rows])
        mb: dict[str, Any] = {k: getattr(p, k).to(trainer.device) for k in _KEYS}
        for k in ("temperature", "group"):  # the sampled policy; None: the raw logits
            v = getattr(p, k)
            mb[k] = None if v is None else v.to(trainer.device)
        mb["allowed"] = [a.to(trainer.device) for a in p.allowed]
        micro.append(mb)
    stats = LossStats(EXTRA_SUMS, EXTRA_MAXES)
    if not micro:  # this replica got no trajectories (DP > 1): zero gradients, no schedule
        return stats
    run = get_forward_backward_func()
    common = {"num_microbatches": len(micro), "seq_length": 0, "micro_batch_size": 0}
    ref_logprobs: list[torch.Tensor] = []
    with device_mode(trainer.cpu):
        if trainer.ref_model is not None:  # the frozen reference's log-probs, forward only
            with torch.no_grad():
                run(forward_step_func=partial(_forward, trainer, _ref_loss, ref_logprobs),
                    data_iterator=iter(micro), model=[trainer.ref_model], forward_only=True,
                    **common)
        state = {"ref": iter(ref_logprobs), "stats": stats, "sums": stats.sums,
                 "maxes": stats.maxima, "normalizer": normalizer}
        run(forward_step_func=partial(_forward, trainer, _loss, state),
            data_iterator=iter(micro), model=[trainer.model], forward_only=False, **common)
    return stats


def _forward(trainer: Any, loss_fn: Any, state: Any, data_iterator: Any,
             model: Any) -> tuple[torch.Tensor, Any]:
    t = next(data_iterator)
    out = model(input_ids=t["ids"], position_ids=t["positions"], attention_mask=t["mask"])
    return out, partial(loss_fn, trainer, state, t)


def _ref_loss(trainer: Any, store: list[torch.Tensor], t: dict[str, torch.Tensor],
              output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp, _ = _policy_logprobs(output[..., : trainer.arch.vocab], t, False)
    store.append(logp.detach())
    return output.new_zeros(()), torch.tensor(1, dtype=torch.int), {}


def _loss(trainer: Any, state: dict[str, Any], t: dict[str, torch.Tensor],
          output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The step's loss on one micro-batch (last stage): the objective trainer ``torch``
    computes too (:func:`rollart_sdk.backends.objective.decoupled_ppo_objective`), its
    statistics added to the step's."""
    o = trainer.options
    logits = output[..., : trainer.arch.vocab]  # drop the TP vocabulary padding
    logp, entropy = _policy_logprobs(logits, t, o.compute_entropy, state)
    # seq-mean over packed rows: weight each token by 1 / (its trajectory's masked
    # tokens) and divide by the number of trajectories (token sums).
    seq_w = t["seq_weight"][:, 1:] if o.loss_agg == "seq-mean" else None
    ref_lp = next(state["ref"]) if trainer.ref_model is not None else None
    obj = decoupled_ppo_objective(logp, t["behaviour"][:, 1:], t["advantages"][:, 1:],
                                  t["loss_mask"][:, 1:], t["versions"][:, 1:], trainer.version,
                                  o, state["normalizer"], token_weights=seq_w, ref_logp=ref_lp)
    state["stats"].add(obj, entropy)
    return obj.loss, torch.tensor(1, dtype=torch.int), {}


def _policy_logprobs(logits: torch.Tensor, t: dict[str, Any], entropy: bool,
                     state: dict[str, Any] | None = None) -> tuple[torch.Tensor, float]:
    """Log-probs ``[B, L-1]`` of the trained tokens (0 elsewhere) under the policy each
    was sampled from (temperature, allowed ids: ``policy_token_logprobs``, as trainer
    ``torch`` computes them), and their summed entropy. Only the trained positions go
    through the softmax. With ``state`` (the step's sums and maxima), the constrained
    positions' mass on their allowed ids (unmasked policy, the sample's temperature) is
    added to ``allowed_mass``/``allowed_rows``/``allowed_gap``."""
    sel = t["loss_mask"][:, 1:].bool()
    r, c = sel.nonzero(as_tuple=True)
    temp, group = t.get("temperature"), t.get("group")
    args = (logits[r, c], t["ids"][r, c + 1], None if temp is None else temp[r, c + 1],
            None if group is None else group[r, c + 1], t.get("allowed", ()), entropy)
    if state is not None and group is not None:
        picked, ent, log_mass = policy_token_logprobs(*args, allowed_mass=True)
        mass = log_mass[~torch.isnan(log_mass)].exp()
        if mass.numel():
            state["sums"]["allowed_mass"] += float(mass.sum())
            state["sums"]["allowed_rows"] += float(mass.numel())
            state["maxes"]["allowed_gap"] = max(state["maxes"]["allowed_gap"],
                                                1.0 - float(mass.min()))
    else:
        picked, ent = policy_token_logprobs(*args)
    logp = torch.zeros(sel.shape, dtype=picked.dtype, device=picked.device)
    return logp.index_put((r, c), picked), ent
