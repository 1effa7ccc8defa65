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

from rollart_sdk.algorithms import (
    aggregate,
    decoupled_anchor,
    kl_penalty,
    policy_token_logprobs,
    ppo_clip_loss,
)
from rollart_trainer_megatron.packing import pack
from rollart_trainer_megatron.pipeline import device_mode

METRIC_SUMS = ("loss", "pg_loss", "kl", "clip", "approx_kl", "ratio", "entropy", "stale",
               "tis_w", "tokens", "beh_ratio", "mismatch", "fresh", "allowed_mass",
               "allowed_rows")
# allowed_gap: 1 - the smallest allowed mass of a constrained position (a max reduces it)
METRIC_MAXES = ("ratio", "beh_ratio", "mismatch", "allowed_gap")
_KEYS = ("ids", "positions", "mask", "loss_mask", "behaviour", "versions", "advantages",
         "seq_weight")


def forward_backward(trainer: Any, batch: list[Any], plan: list[list[list[int]]],
                     normalizer: float) -> tuple[dict[str, float], dict[str, float]]:
    """Forward and backward over every micro-batch of ``plan``; gradients accumulate in
    the parameters. Returns this stage's metric sums and maxima (``METRIC_MAXES``: the
    ratio pi / pi_prox and the behaviour ratio pi / mu; zeros except on the last stage)."""
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
    sums = dict.fromkeys(METRIC_SUMS, 0.0)
    maxes = dict.fromkeys(METRIC_MAXES, 0.0)
    if not micro:  # this replica got no trajectories (DP > 1): zero gradients, no schedule
        return sums, maxes
    run = get_forward_backward_func()
    common = {"num_microbatches": len(micro), "seq_length": 0, "micro_batch_size": 0}
    ref_logprobs: list[torch.Tensor] = []
    with device_mode(trainer.cpu):
        if trainer.ref_model is not None:  # the frozen reference's log-probs, forward only
            with torch.no_grad():
                run(forward_step_func=partial(_forward, trainer, _ref_loss, ref_logprobs),
                    data_iterator=iter(micro), model=[trainer.ref_model], forward_only=True,
                    **common)
        state = {"ref": iter(ref_logprobs), "sums": sums, "maxes": maxes,
                 "normalizer": normalizer}
        run(forward_step_func=partial(_forward, trainer, _loss, state),
            data_iterator=iter(micro), model=[trainer.model], forward_only=False, **common)
    return sums, maxes


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
    """The step's loss on one micro-batch (last stage), exactly as trainer ``torch``
    computes it; accumulates the metric sums."""
    o = trainer.options
    sums = state["sums"]
    logits = output[..., : trainer.arch.vocab]  # drop the TP vocabulary padding
    logp, entropy = _policy_logprobs(logits, t, o.compute_entropy, state)
    mask = t["loss_mask"][:, 1:]
    beh = t["behaviour"][:, 1:]
    adv = t["advantages"][:, 1:]
    m = mask.bool()
    stale = (t["versions"][:, 1:] < trainer.version) & m
    old, w, beh_ratio = decoupled_anchor(logp, beh, stale, m, o.tis_cap, o.tis_on_fresh)
    # seq-mean over packed rows: weight each token by 1 / (its trajectory's masked
    # tokens) and divide by the number of trajectories (token sums).
    seq_w = t["seq_weight"][:, 1:] if o.loss_agg == "seq-mean" else None
    normalizer = state["normalizer"]
    pg_loss, st = ppo_clip_loss(
        logp, old, adv, mask, o.clip_eps, o.clip_eps_high, "token-mean",
        is_weights=w if seq_w is None else w * seq_w, normalizer=normalizer,
    )
    loss = pg_loss
    if trainer.ref_model is not None:
        ref_lp = next(state["ref"])
        kl = kl_penalty(logp, ref_lp, o.kl_kind)
        kl_tok = kl if seq_w is None else kl * seq_w
        loss = loss + o.kl_coef * aggregate(kl_tok, mask, "token-mean", normalizer)
        sums["kl"] += float((kl.detach() * mask).sum())
    ntok = float(st["tokens"])
    sums["loss"] += float(loss.detach())
    sums["pg_loss"] += float(pg_loss.detach())
    sums["clip"] += float(st["clip_frac"]) * ntok
    sums["approx_kl"] += float(st["approx_kl"]) * ntok
    sums["ratio"] += float(st["ratio_mean"]) * ntok
    sums["stale"] += float(stale.sum())
    sums["tis_w"] += float((w * stale).sum())
    sums["tokens"] += ntok
    sums["beh_ratio"] += float(beh_ratio.sum())
    # train/inference mismatch: engine vs trainer log-prob on fresh tokens (same weights)
    fresh = (m & ~stale).float()
    gap = (logp.detach() - beh).abs() * fresh
    sums["mismatch"] += float(gap.sum())
    sums["fresh"] += float(fresh.sum())
    maxes = state["maxes"]
    if bool(fresh.any()):
        maxes["mismatch"] = max(maxes["mismatch"], float(gap.max()))
    maxes["ratio"] = max(maxes["ratio"], float(st["ratio_max"]))
    if bool(m.any()):
        maxes["beh_ratio"] = max(maxes["beh_ratio"], float(beh_ratio.max()))
    if o.compute_entropy:
        sums["entropy"] += entropy
    return loss, torch.tensor(1, dtype=torch.int), {}


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
