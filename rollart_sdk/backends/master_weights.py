"""fp32 master weights and loss scaling around any torch optimizer (AdamW in the trainers):
what :class:`rollart_sdk.backends.precision.PrecisionOptions` asks for, shared by
trainers ``torch`` and ``megatron``. The module docstring of
:mod:`rollart_sdk.backends.precision` says why.

One step, in the order a trainer calls it::

    opt.zero_grad()
    opt.scale_loss(loss).backward()     # per micro-batch: loss x the loss scale
    grads = opt.main_grads()            # fp32 copies of the gradients, / the scale
    ... all-reduce ``grads`` over data-parallel ranks, clip ``opt.main_params`` ...
    opt.update_scale(finite)            # dynamic scaling: back off on inf / nan
    if finite: opt.step()               # AdamW on the fp32 masters, rounded into the model

Gradients are reduced in fp32 (Megatron's default for bf16), so a sum over ranks loses
nothing either. Without master weights (``master_weights=False``) the same calls step the
model's own parameters, and ``state_dict`` is the inner optimizer's unchanged.

Checkpoints: ``state_dict()`` is the inner optimizer's (torch's layout), with each
parameter's fp32 master under ``state[i]["master"]`` and the loss scale in the param
groups (``loss_scale``, ``loss_scale_good_steps``): a checkpoint writer that stores the
state dict stores the masters, and ``load_state_dict`` puts them back. A checkpoint saved
without masters loads too (the masters start from the loaded, rounded parameters), and
one with masters loads into an optimizer without them (the masters are dropped: the
model file holds them rounded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

_SCALE_KEYS = ("loss_scale", "loss_scale_good_steps")


class LossScaler:
    """A loss scale, fixed or dynamic (halve on overflow, double after
    ``growth_interval`` finite steps; never below ``min_scale``): PyTorch AMP's
    ``GradScaler`` and Megatron's ``DynamicGradScaler`` rule, as plain Python state."""

    def __init__(self, scale: float, dynamic: bool, growth_interval: int = 1000,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 min_scale: float = 1.0) -> None:
        self.scale = float(scale)
        self.dynamic = dynamic
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.min_scale = min_scale
        self.good_steps = 0

    def update(self, finite: bool) -> None:
        """After a step's gradients were checked: ``finite`` False backs off."""
        if not self.dynamic:
            return
        if finite:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0
        else:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0


def scale_of(scaler: LossScaler | None) -> float:
    """The scale the next backward uses: 1.0 without a scaler."""
    return scaler.scale if scaler is not None else 1.0


def scaled(loss: torch.Tensor, scaler: LossScaler | None) -> torch.Tensor:
    """``loss`` x the loss scale, to call ``backward`` on (``loss`` itself at scale 1)."""
    scale = scale_of(scaler)
    return loss * scale if scale != 1.0 else loss


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` (float32) rounded to bfloat16 up or down at random, with the probability of
    each its distance to the other: ``E[round(x)] = x``. Rounded to nearest, a master that
    starts on a bfloat16 value (every model loaded in bfloat16) does not move its weight
    until its updates add up to half a bfloat16 step (``|w| * 2**-9``: tens of steps at RL
    learning rates), so the policy the engines get lags the masters; rounded at random,
    each weight moves with a probability in proportion to its update from the first
    step. ``generator`` is on ``x``'s device (the random bits are drawn there)."""
    bits = x.detach().to(torch.float32).contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device,
                          generator=generator)
    # Adding below the top 16 bits carries into them with the probability of the
    # remainder; on the magnitude, so for either sign. Then keep the top 16: bfloat16's.
    rounded = (bits + noise) & -65536
    return rounded.view(torch.float32).to(torch.bfloat16)


class MasterWeightsOptimizer:
    """``make_optimizer(main_params)`` stepping fp32 copies of ``params`` (when
    ``master_weights``), with an optional loss scale; ``param_groups``, ``state``,
    ``zero_grad``, ``state_dict`` and ``load_state_dict`` as a torch optimizer's.

    ``params``: the model's trainable parameters, in any dtype. ``main_params``: the
    tensors the inner optimizer steps: fp32 masters (same order and shapes), or
    ``params`` themselves without master weights.
    """

    # load_state_dict puts every moment in the dtype it is stepped in (fp32 with masters,
    # the model's without), whatever the checkpoint was saved with: a checkpoint reader
    # must not restore the saved dtypes over it.
    manages_state_dtypes = True

    def __init__(self, params: Iterable[torch.Tensor],
                 make_optimizer: Callable[[list[torch.Tensor]], Any], *,
                 master_weights: bool, scaler: LossScaler | None = None,
                 rounding: str = "nearest", seed: int = 0) -> None:
        """``rounding``: how the masters go into bfloat16 parameters after each step,
        ``nearest`` or ``stochastic`` (:func:`stochastic_round_bf16`, its draws keyed by
        ``seed`` and the step count, so a resumed run rounds as the first would have)."""
        if rounding not in ("nearest", "stochastic"):
            raise ValueError(f"rounding must be nearest or stochastic, got {rounding!r}")
        self.params = list(params)
        self.master_weights = master_weights
        self.rounding = rounding
        self.seed = seed
        if master_weights:
            self.main_params = [p.detach().to(torch.float32, copy=True) for p in self.params]
        else:
            self.main_params = self.params
        self.inner = make_optimizer(self.main_params)
        self.scaler = scaler

    # ------------------------------------------------------------------ torch's API

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        """The inner optimizer's per-parameter state, keyed by ``main_params``."""
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for tensors in ((self.params, self.main_params) if self.master_weights
                        else (self.params,)):
            for p in tensors:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    # ------------------------------------------------------------------ the step

    @property
    def loss_scale(self) -> float:
        """The scale the next backward should use (1.0 without scaling)."""
        return scale_of(self.scaler)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` x the loss scale, to call ``backward`` on."""
        return scaled(loss, self.scaler)

    def main_grads(self) -> list[torch.Tensor]:
        """After the backward passes: each parameter's gradient (zeros where it got none),
        divided by the loss scale, as ``main_params[i].grad`` (fp32 with master weights:
        the model's low-precision gradients are freed). Returns those gradients, in
        order, for the caller to all-reduce and clip before :meth:`step`."""
        inv = 1.0 / self.loss_scale
        out = []
        for p, m in zip(self.params, self.main_params, strict=True):
            g = p.grad
            if self.master_weights:
                if g is None:
                    grad = torch.zeros_like(m)
                else:  # a copy, in fp32 before unscaling (small values stay normal)
                    grad = g.detach().to(torch.float32, copy=True)
                p.grad = None
                m.grad = grad
            else:
                if g is None:
                    p.grad = g = torch.zeros_like(p)
                grad = g
            if inv != 1.0:
                grad.mul_(inv)
            out.append(grad)
        return out

    def update_scale(self, finite: bool) -> None:
        """Tell the loss scaler whether this step's gradients were finite (call on every
        step, taken or skipped)."""
        if self.scaler is not None:
            self.scaler.update(finite)

    @torch.no_grad()
    def step(self) -> None:
        """The inner optimizer's step on ``main_params``; with master weights, the model's
        parameters then take the masters rounded to their dtype (to nearest, or for
        bfloat16 parameters stochastically: ``rounding``)."""
        self.inner.step()
        if not self.master_weights:
            return
        seed = None
        if self.rounding == "stochastic":
            step = self.inner.state.get(self.main_params[0], {}).get("step", 0)
            seed = (self.seed * 1_000_003 + int(step)) % 2**63
        gens: dict[torch.device, torch.Generator] = {}  # one per device, seeded alike
        for p, m in zip(self.params, self.main_params, strict=True):
            if seed is not None and p.dtype == torch.bfloat16:
                if m.device not in gens:
                    gens[m.device] = torch.Generator(device=m.device).manual_seed(seed)
                p.copy_(stochastic_round_bf16(m, gens[m.device]))
            else:
                p.copy_(m)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        sd = self.inner.state_dict()
        if not self.master_weights and self.scaler is None:
            return sd
        state = dict(sd["state"])
        if self.master_weights:
            for i, m in enumerate(self.main_params):
                # a new dict: torch's state_dict hands out its live per-parameter dicts
                state[i] = {**state.get(i, {}), "master": m}
        groups = [dict(g) for g in sd["param_groups"]]
        if self.scaler is not None:
            for g in groups:
                g["loss_scale"] = self.scaler.scale
                g["loss_scale_good_steps"] = self.scaler.good_steps
        return {**sd, "state": state, "param_groups": groups}

    @torch.no_grad()
    def _load_masters(self, masters: dict[int, torch.Tensor]) -> None:
        """The saved masters into ``main_params`` and, rounded to nearest, into the model
        (a weight rounded stochastically was saved as drawn and stays); a parameter
        without a saved master seeds its master."""
        for i, (p, m) in enumerate(zip(self.params, self.main_params, strict=True)):
            src = masters.get(i)
            if src is None:
                m.copy_(p)
                continue
            if src.shape != m.shape:
                raise ValueError(
                    f"loaded master weight {i} has shape {tuple(src.shape)}, the model's "
                    f"parameter {tuple(m.shape)} (was it saved from a different "
                    "architecture?)")
            m.copy_(src)
            if not (self.rounding == "stochastic" and p.dtype == torch.bfloat16):
                p.copy_(m)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this class, with or without masters, or of the inner
        optimizer alone; call after the model's parameters were loaded (they seed the
        masters a state dict does not have)."""
        groups = [dict(g) for g in state_dict["param_groups"]]
        scale = {k: groups[0][k] for k in _SCALE_KEYS if groups and k in groups[0]}
        for g in groups:
            for k in _SCALE_KEYS:
                g.pop(k, None)
        state: dict[Any, dict[str, Any]] = {}
        masters: dict[int, torch.Tensor] = {}
        for pid, s in state_dict["state"].items():
            rest = dict(s)
            master = rest.pop("master", None)
            if master is not None:
                masters[int(pid)] = master
            if self.master_weights:  # moments saved by a run without masters (model dtype)
                rest = {k: v.float() if (torch.is_tensor(v) and v.is_floating_point()
                                         and k != "step") else v for k, v in rest.items()}
            if rest:
                state[pid] = rest
        self.inner.load_state_dict({**state_dict, "state": state, "param_groups": groups})
        if self.master_weights:
            self._load_masters(masters)
        if self.scaler is not None and "loss_scale" in scale:
            self.scaler.scale = float(scale["loss_scale"])
            self.scaler.good_steps = int(scale.get("loss_scale_good_steps", 0))
