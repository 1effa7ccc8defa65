"""Trainer ``torch``: one GRPO / PPO-clip optimiser step per batch of trajectories.

What one ``train_step`` does, in order (the README has the formulas):

1. advantages: samples without one get GRPO advantages over the *whole* batch (with
   data parallelism, rewards are gathered from every rank first);
2. micro-batches: samples sorted by length, right-padded, cut at ``micro_batch_size``
   sequences or ``micro_batch_tokens`` padded tokens (similar lengths share a forward);
3. per token: log-probs under the current weights (the LM head runs only on the trained
   positions, log-prob and entropy from one log-sum-exp), the policy loss anchored at the
   behaviour policy for fresh tokens and at the current weights with a truncated
   importance weight for stale ones (decoupled PPO), plus an optional KL to a frozen
   reference; every micro-batch loss is normalised by the token (or sequence) count of
   the whole batch on all ranks, so accumulated gradients equal the full-batch gradient;
4. gradients summed over ranks (torch.distributed all-reduce), clipped, AdamW step; for a
   bfloat16 / float16 model (``master_weights``, on by default there) the gradients are
   first copied into fp32 master weights, summed and clipped there, AdamW (with fp32
   moments) steps the masters and the model takes them rounded; float16 also scales the
   loss (``loss_scale``) and skips a step whose gradients overflow
   (:mod:`rollart_sdk.backends.master_weights`);
5. ``version`` + 1.
"""

from __future__ import annotations

import copy
import math
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rollart_sdk.algorithms import (
    AllowedMassMeter,
    MismatchMeter,
    allowed_groups,
    policy_temperature,
    policy_token_logprobs,
)
from rollart_sdk.backends.distributed import (
    all_reduce_flat,
    all_reduce_small,
    check_rank,
    fill_advantages_across,
    init_process_group,
)
from rollart_sdk.backends.master_weights import LossScaler, MasterWeightsOptimizer
from rollart_sdk.backends.objective import LossStats, decoupled_ppo_objective
from rollart_sdk.config import ModelConfig
from rollart_sdk.interfaces import check_train_sample
from rollart_sdk.models import hf_checkpoint_path, load_causal_lm, resolve_device
from rollart_sdk.types import TrainSample, WeightBucket
from rollart_sdk.weights import split_buckets, without_aliases
from rollart_trainer_torch import checkpoint, lora
from rollart_trainer_torch.adamw import LeanAdamW
from rollart_trainer_torch.options import TorchTrainerOptions
from rollart_trainer_torch.prefix_tree import PrefixTree, tree_micro_batches

HEAD_ONLY_MODELS = ("llama", "qwen2", "qwen3", "mistral")
# Samples of a constrained task with nothing to train that the allowed mass is measured on
# (a step's metric: a group's worth of positions is enough to see where the mass is).
MASS_SAMPLES = 8
# Files of a checkpoint folder that save_pretrained copies along (tokenizer, templates).
_SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass
class _StepParts:
    """A train step in progress: what its parts (:meth:`TorchTrainer.accumulate`, then
    ``train_step``'s own) have added up."""

    tokens: float = 0.0  # loss tokens of the parts so far (all ranks)
    seqs: float = 0.0  # sequences with a loss token
    parts: int = 0
    ran: bool = False  # a backward pass has run (gradients are held)
    forward_tokens: int = 0
    batch: list[TrainSample] = field(default_factory=list)
    run: list[TrainSample] = field(default_factory=list)  # the samples run (advantage != 0)
    kept: list[tuple[dict[str, Any], Any, Any, float]] = field(default_factory=list)
    stats: LossStats = field(default_factory=LossStats)

    def normalizer(self, loss_agg: str) -> float:
        return max(self.tokens if loss_agg == "token-mean" else self.seqs, 1.0)


class TorchTrainer:
    """Implements :class:`rollart_sdk.interfaces.Trainer` on a Hugging Face causal LM.

    ``model.path`` must be a checkpoint folder (the pipeline turns ``gguf`` / ``tiny``
    models into one before workers start). With ``world_size > 1`` every rank builds
    one ``TorchTrainer`` with the same options and ``init_method`` (``tcp://host:port``
    or ``file:///shared/path``), receives its shard of each batch, and all ranks stay in
    lockstep: same number of collectives per step, identical weights after each step.
    """

    def __init__(
        self,
        model: ModelConfig | str,
        rank: int = 0,
        world_size: int = 1,
        init_method: str | None = None,
        **options: Any,
    ) -> None:
        self.options = TorchTrainerOptions.model_validate(options)
        o = self.options
        self.rank, self.world_size = check_rank(rank, world_size)
        self.model_path = hf_checkpoint_path(model, 'torch', ". When constructing TorchTrainer directly, pass ModelConfig(path=...)")
        dtype = getattr(torch, model.dtype) if isinstance(model, ModelConfig) else torch.float32
        if o.num_threads:
            torch.set_num_threads(o.num_threads)
        random.seed(o.seed)
        torch.manual_seed(o.seed)
        self.device = resolve_device(o.device, self.rank)
        if self.world_size > 1:
            self._init_distributed(init_method)

        # The SDK's own Llama-family forward when it covers the checkpoint (model.
        # implementation auto; no transformers import), else transformers'. Gradient
        # checkpointing is transformers'.
        impl = model.implementation if isinstance(model, ModelConfig) else "auto"
        if o.gradient_checkpointing and impl == "auto":
            impl = "transformers"
        if o.gradient_checkpointing and impl == "native":
            raise ValueError("trainer.options.gradient_checkpointing needs transformers' "
                             "model: set model.implementation to auto or transformers")
        self.model = load_causal_lm(self.model_path, str(dtype).removeprefix("torch."), impl)
        self.model.to(self.device)
        self.model.train()
        if o.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # LoRA (trainer.options.lora): adapters injected in place, the base frozen; the
        # reference copy below then starts as the base (LoRA's B starts at 0).
        self._lora = self._wrap_lora() if o.lora is not None else None
        if self.world_size > 1:  # same start on every rank whatever each one loaded
            with torch.no_grad():
                for t in self.model.state_dict().values():
                    dist.broadcast(t, src=0)
        # A frozen copy of the starting policy, only when the KL term needs it.
        self.ref_model = None
        if o.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._make_optimizer(str(dtype).removeprefix("torch."))
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        # Architectures whose logits are exactly lm_head(final hidden state): the LM head
        # can then run on the trained positions only (others: a full forward).
        self._head_only = getattr(self.model.config, "model_type", "") in HEAD_ONLY_MODELS
        self._version = 0
        self._step = 0
        self._part: _StepParts | None = None  # the step whose parts are being added up

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        """Policy version: the number of batches trained (engines tag tokens with it); one
        per ``train_step``, however many AdamW steps ``updates_per_batch`` takes in it."""
        return self._version

    @property
    def can_accumulate(self) -> bool:
        """Whether :meth:`accumulate` may be called: one rank, one AdamW step per batch
        (a later pass of ``updates_per_batch`` re-runs every micro-batch of the batch)."""
        return self.world_size == 1 and self.options.updates_per_batch == 1

    def accumulate(self, batch: list[TrainSample]) -> None:
        """Forward and backward of a part of the next step's batch, whole groups (GRPO
        advantages are per group): its gradient is added, the optimiser does not step.
        The next :meth:`train_step` ends the step with its own part: ``accumulate(a);
        train_step(b)`` is ``train_step(a + b)`` (the same gradient, up to rounding, and
        the same metrics). The pipeline sends each group as it completes, so that the
        forward and backward passes run while the rollout's slowest episodes finish
        (``train.stream_groups``)."""
        if not self.can_accumulate:
            raise ValueError(
                "accumulate needs one trainer rank and trainer.options.updates_per_batch 1 "
                f"(world_size {self.world_size}, updates_per_batch "
                f"{self.options.updates_per_batch}): send the whole batch to train_step")
        self._add_part(batch)

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """``updates_per_batch`` AdamW steps on ``batch`` (this rank's shard; one by
        default), with the parts :meth:`accumulate` added before it; returns whole-batch
        metrics (the first pass's, plus ``updates`` and ``clip_frac_last``)."""
        if not batch and self.world_size == 1 and self._part is None:
            raise ValueError("train_step got an empty batch")
        part = self._add_part(batch)
        self._part = None
        return self._finish(part)

    def _add_part(self, batch: list[TrainSample]) -> _StepParts:
        """Forward and backward of ``batch``, added to the step in progress.

        Every micro-batch loss is divided by the loss tokens (or sequences) of all parts
        so far on all ranks; the gradient held from earlier parts is first rescaled from
        their count to the new one. So the held gradient is always the mean over the
        parts so far, and after the last it is the whole batch's: with one part (a plain
        ``train_step``) no rescale happens and the arithmetic is the one-call step's."""
        o = self.options
        for i, s in enumerate(batch):
            check_train_sample(i, s)
        self._fill_advantages(batch)
        part = self._part
        if part is None:
            part = self._part = _StepParts()
            self._mismatch = MismatchMeter()  # engine vs trainer log-probs, fresh tokens
            self._mass = AllowedMassMeter()  # constrained tasks: mass on the allowed ids
            self.optimizer.zero_grad(set_to_none=True)
        before = part.normalizer(o.loss_agg)
        n_tokens = sum(sum(s.loss_mask[1:]) for s in batch)
        n_seqs = sum(1 for s in batch if any(s.loss_mask[1:]))
        counts = self._all_reduce(torch.tensor([n_tokens, n_seqs], dtype=torch.float64))
        part.tokens += float(counts[0])
        part.seqs += float(counts[1])
        normalizer = part.normalizer(o.loss_agg)
        if part.ran and normalizer != before:
            held = [p.grad for p in self.params if p.grad is not None]
            if held:
                torch._foreach_mul_(held, before / normalizer)
            part.stats.rescale_losses(before / normalizer)
        part.batch.extend(batch)
        part.parts += 1
        # A sample whose advantage is 0 (a group that all failed or all succeeded) adds
        # exactly nothing to the policy loss or its gradient: unless a KL term needs it,
        # it is not run through the model. The normaliser above counts its tokens, so the
        # gradient is the whole batch's; AdamW still steps (its moments decay) when no
        # sample is left. Ratio, clip, entropy metrics are over the samples run.
        run = batch
        if o.skip_zero_advantage and self.ref_model is None:
            run = [s for s in batch if s.advantage]
        part.run.extend(run)
        micro_batches, shared = self._micro_batches(run) if run else ([], False)
        for mb in micro_batches:
            t, tree = self._pad(mb), (PrefixTree.build(mb) if shared else None)
            part.forward_tokens += tree.computed if tree is not None else t["ids"].numel()
            anchor = self._micro_step(t, tree, None, normalizer, part.stats, False)
            part.ran = True
            if o.updates_per_batch > 1:
                # Built on the first pass and kept for the later ones: the padded
                # samples, the prefix tree and the first pass's anchors and weights.
                part.kept.append((t, tree, anchor, normalizer))
        return part

    def _finish(self, part: _StepParts) -> dict[str, float]:
        """The step's AdamW update(s) on the gradient of every part, and its metrics."""
        o = self.options
        stats = part.stats
        batch, run = part.batch, part.run
        # At the weights before the step, as in each part (they have not moved).
        self._measure_mass(batch, run)
        grad_norms: list[float] = []
        skipped = False
        for update in range(o.updates_per_batch):
            if update > 0:
                self.optimizer.zero_grad(set_to_none=True)
                for t, tree, anchor, normalizer in part.kept:
                    self._micro_step(t, tree, anchor, normalizer, stats,
                                     update == o.updates_per_batch - 1)
            loss_scale = self.optimizer.loss_scale  # the one this pass's backward used
            self._all_reduce_grads()
            max_norm = o.grad_clip if o.grad_clip > 0 else math.inf
            # fp32 masters' gradients (master weights), else the parameters'
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.optimizer.main_params,
                                                                   max_norm)))
            # The schedule counts batches (train steps), whatever updates_per_batch.
            for group in self.optimizer.param_groups:
                group["lr"] = o.lr_at(o.lr, self._step)
            # A non-finite gradient would poison AdamW's moments for good: no step, and no
            # later pass of this batch either. Under float16 loss scaling that is an
            # overflow: the scale backs off and the next batch runs at half of it.
            skipped = not math.isfinite(grad_norms[-1])
            self.optimizer.update_scale(not skipped)
            if not skipped:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if skipped:
                break
        self._version += 1
        self._step += 1
        stats.reduce(self._all_reduce)
        grad_norm = grad_norms[0]  # the first pass's (the batch's gradient)
        ntok = max(stats.sums["tokens"], 1.0)  # loss tokens run through the model (all ranks)
        forward_samples = self._all_reduce(torch.tensor([float(len(run))], dtype=torch.float64))
        rewards = [s.reward for s in batch]
        advs = [float(s.advantage or 0.0) for s in batch]
        return {
            **stats.metrics(o.compute_entropy),
            "grad_norm": grad_norm,
            **self._mismatch_metrics(),  # per engine worker too
            **self._allowed_mass_metrics(),
            "tokens": part.tokens,  # loss tokens of the whole batch (all ranks)
            "sequences": part.seqs,
            "forward_sequences": float(forward_samples[0]),  # those run (advantage != 0)
            # tokens run through the model (shared prefixes once) / in the batch
            "forward_tokens": float(part.forward_tokens),
            "batch_tokens": float(sum(len(s.input_ids) for s in batch)),
            # reward/advantage means are of this rank's shard (the pipeline logs the batch's)
            "reward_mean": sum(rewards) / max(len(rewards), 1),
            "advantage_abs_mean": sum(abs(a) for a in advs) / max(len(advs), 1),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "skipped": float(skipped),
            # the loss scale of the last pass's backward (1 without scaling; float16:
            # halved after a skipped step)
            "loss_scale": float(loss_scale),
            "version": float(self._version),
            # AdamW steps this batch took (updates_per_batch, fewer after a skipped one)
            "updates": float(len(grad_norms) - int(skipped)),
            # the last pass's clip fraction (updates_per_batch > 1): how far the passes moved
            "clip_frac_last": (stats.sums["last_clip"] / ntok if len(grad_norms) > 1
                               else float("nan")),
            # parts the step's gradient was added up from (accumulate calls + this one)
            "parts": float(part.parts),
        }

    def _micro_step(self, t: dict[str, Any], tree: Any, anchor: Any, normalizer: float,
                    stats: LossStats, last: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of one micro-batch; returns its anchors ``(old, w)``.

        ``anchor`` None: the batch's first pass. Decoupled PPO: a token sampled by an older
        version is anchored at the current (proximal) weights and reweighted by
        ``min(pi_prox / mu, cap)``; a fresh token is anchored at its behaviour log-prob
        (same weights as ours); the batch's metrics are this pass's. A later pass
        (``updates_per_batch`` > 1) keeps the first pass's anchors: its ratio is to the
        policy before the batch's first update, which PPO's clip bounds; ``last`` adds its
        clip fraction to ``last_clip``. The loss and its statistics:
        :mod:`rollart_sdk.backends.objective`."""
        o = self.options
        first = anchor is None
        mask = t["mask"][:, 1:]
        m = mask.bool()
        logp, entropy = self._logprobs(self.model, t, m, o.compute_entropy and first, tree,
                                       mass=first)
        ref_lp = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_lp, _ = self._logprobs(self.ref_model, t, m, False, tree)
        obj = decoupled_ppo_objective(logp, t["beh"][:, 1:], t["adv"], mask, t["vers"][:, 1:],
                                      self._version, o, normalizer, agg=o.loss_agg,
                                      ref_logp=ref_lp, anchor=anchor)
        if first:
            self._mismatch.add(logp, t["beh"][:, 1:], (m & ~obj.stale).float(), t["engine"])
        self.optimizer.scale_loss(obj.loss).backward()
        if first:
            stats.add(obj, entropy)
        elif last:
            stats.add_last(obj)
        return obj.old, obj.weights

    def export_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]:
        """This version's weights as checksummed buckets (CPU copies, taken lazily bucket
        by bucket, so a later step cannot change a bucket already handed out), in
        ``model.dtype``: with master weights, the fp32 masters rounded (what the model
        runs). A tied embedding goes once, as ``model.embed_tokens.weight``."""
        if self._lora is not None:  # LoRA: the adapter only (rollart_sdk.weights.lora)
            return split_buckets(lora.export_tensors(self.model), bucket_bytes, self._version)
        # a tied embedding once (the engines tie it again)
        named = ((k, v.detach().to("cpu", copy=True))
                 for k, v in without_aliases(self.model.state_dict().items()))
        return split_buckets(named, bucket_bytes, self._version)

    def save_checkpoint(self, path: str) -> None:
        """Model, AdamW moments, step/version and RNG states, as safetensors + JSON
        (:mod:`rollart_trainer_torch.checkpoint`); with master weights the optimizer's
        state dict also holds the fp32 masters (``<id>.master``) and the loss scale, so a
        resumed bf16 run continues from the masters, not from their rounding.

        Ranks hold identical state, so only rank 0 writes; ``path`` is a folder.
        """
        if self.rank != 0:
            return
        checkpoint.write(Path(path), self.model, self.optimizer, {
            "version": self._version,
            "step": self._step,
            "world_size": self.world_size,
            "options": self.options.model_dump(mode="json"),
        }, adapter=lora.trainable_state(self.model) if self._lora is not None else None)

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote; the next step is then the same as
        the one the saving trainer would have taken. Every rank loads (shared storage)."""
        state = checkpoint.read(Path(path), self.model, self.optimizer, str(self.device),
                                self.model_path, adapter=self._lora is not None)
        self._version = int(state["version"])
        self._step = int(state["step"])
        self._part = None  # parts of a step the run stopped in are not the loaded one's

    def save_pretrained(self, path: str) -> None:
        """A Hugging Face checkpoint folder (``AutoModelForCausalLM.from_pretrained``
        loads it), with the source folder's tokenizer files copied along. Rank 0 writes."""
        if self.rank != 0:
            return
        out = Path(path)
        if self._lora is not None:
            self._save_lora(out)
            return
        self.model.save_pretrained(out)
        for name in _SIDE_FILES:
            f = Path(self.model_path) / name
            if f.is_file() and not (out / name).exists():
                shutil.copy2(f, out / name)

    def close(self) -> None:
        """Leave the process group (if this trainer created one)."""
        if self.world_size > 1 and dist.is_initialized():
            # Every rank reaches here before any tears gloo down: a rank destroying the
            # group while a peer's last collective is still in flight aborts the peer.
            dist.barrier()
            dist.destroy_process_group()

    # ------------------------------------------------------------------ internals

    def _wrap_lora(self) -> Any:
        """peft's LoRA on ``self.model`` (:mod:`rollart_trainer_torch.lora`)."""
        assert self.options.lora is not None
        config = lora.wrap(self.model, self.options.lora, self.model_path)
        if self.options.gradient_checkpointing:  # frozen embeddings: keep the graph alive
            self.model.enable_input_require_grads()
        return config

    def _save_lora(self, out: Path) -> None:
        """LoRA's ``save_pretrained``: a peft adapter folder (with the tokenizer files),
        and ``merged/``, the merged model, when ``lora.save_merged``."""
        assert self.options.lora is not None
        lora.save_adapter(self.model, self._lora, out)
        for name in _SIDE_FILES:
            f = Path(self.model_path) / name
            if f.is_file():
                shutil.copy2(f, out / name)
        if self.options.lora.save_merged:
            lora.save_merged(self.model, self.model_path, out / "merged", _SIDE_FILES)

    def _init_distributed(self, init_method: str | None) -> None:
        init_process_group(self.rank, self.world_size, init_method, self.options.dist_backend,
                           self.device.type == "cuda")

    def _mismatch_metrics(self) -> dict[str, float]:
        """The step's train/inference mismatch over every rank's tokens."""
        if self.world_size > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, self._mismatch.by_engine)
            self._mismatch.by_engine = {}
            self._mismatch.merge(gathered)
        return self._mismatch.metrics()

    def _measure_mass(self, batch: list[TrainSample], run: list[TrainSample]) -> None:
        """Constrained tasks none of whose samples is run this step (advantage 0: a task
        that fails every time, the case where the measure matters most): the allowed mass
        on the first ``MASS_SAMPLES`` of their samples, forward only, at the weights
        before the step."""
        measured = {s.tag for s in run if s.allowed_token_ids is not None}
        samples = [s for s in batch if s.allowed_token_ids is not None and s.tag not in measured]
        samples = samples[: min(self.options.micro_batch_size, MASS_SAMPLES)]
        if not samples:
            return
        # At most MASS_SAMPLES samples, as a training micro-batch runs (shared prefixes
        # once where the model allows): a padded forward of 64 FrozenLake episodes took
        # 0.4 s a step, more than the training steps after it, on every step before the
        # first success (when nothing else runs through the model).
        micro_batches, shared = self._micro_batches(samples)
        mb = micro_batches[0]
        with torch.no_grad():
            t, tree = self._pad(mb), (PrefixTree.build(mb) if shared else None)
            self._logprobs(self.model, t, t["mask"][:, 1:].bool(), False, tree, mass=True)

    def _allowed_mass_metrics(self) -> dict[str, float]:
        """Constrained tasks: the step's mass on the allowed ids over every rank's
        positions (``allowed_mass_mean``/``_min``, ``allowed_mass/<task>``)."""
        if self.world_size > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, self._mass.by_task)
            self._mass.by_task = {}
            self._mass.merge(gathered)
        return self._mass.metrics()

    def _all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce a small CPU tensor over ranks (identity with one rank)."""
        return t if self.world_size == 1 else all_reduce_small(t, self.device, op=op)

    def _make_optimizer(self, dtype: str) -> MasterWeightsOptimizer:
        """AdamW over the trainable parameters, through fp32 master weights for a
        bfloat16 / float16 model (``master_weights``; its moments are then fp32 too) and
        with float16's loss scaling (``loss_scale``): :mod:`rollart_sdk.backends.master_weights`.
        In float32 (the default) the wrapper adds nothing: AdamW steps the parameters,
        and its state dict is AdamW's own."""
        o = self.options
        dynamic, scale = o.loss_scaling(dtype)
        scaler = (LossScaler(scale, dynamic, o.loss_scale_growth_interval)
                  if dynamic or scale != 1.0 else None)
        # On the CPU, torch.optim.AdamW's update without torch.optim (which imports
        # torch._dynamo: about 0.9 s of a small run's start-up); the same update bit for
        # bit and the same state_dict (rollart_trainer_torch/adamw.py).
        adamw: Any = LeanAdamW if self.device.type == "cpu" else torch.optim.AdamW
        return MasterWeightsOptimizer(
            self.params,
            lambda params: adamw(params, lr=o.lr, betas=o.betas, eps=o.eps,
                                 weight_decay=o.weight_decay),
            master_weights=o.uses_master_weights(dtype), scaler=scaler,
            # the same draws on every data-parallel rank: the replicas stay equal
            rounding=o.rounding(), seed=o.seed)

    def _all_reduce_grads(self) -> None:
        """Sum gradients over ranks in flat buckets (one collective per bucket).

        Losses are already divided by the whole-batch count, so the sum is the
        full-batch gradient. A rank with no samples contributes zeros. With master
        weights the gradients summed are the fp32 masters' (unscaled), so the sum over
        ranks is not rounded to bfloat16.
        """
        grads = self.optimizer.main_grads()
        if self.world_size == 1:
            return
        limit = int(self.options.grad_bucket_mb * 2**20)
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            bucket.append(g)
            size += g.numel() * g.element_size()
            if size >= limit:
                all_reduce_flat(bucket)
                bucket, size = [], 0
        if bucket:
            all_reduce_flat(bucket)

    def _fill_advantages(self, batch: list[TrainSample]) -> None:
        """Advantages (`adv_estimator`) for samples without one, over the batch on *all* ranks."""
        fill_advantages_across(batch, self.options.adv_eps, self.options.adv_normalize_std,
                               self.device, size=self.world_size, rank=self.rank,
                               estimator=self.options.adv_estimator)

    def _micro_batches(self, batch: list[TrainSample]) -> tuple[list[list[TrainSample]], bool]:
        """The micro-batches, and whether they run as prefix trees.

        Shared prefixes (``prefix_sharing``; Llama-family models): samples in
        lexicographic order, so that those sharing a prefix are neighbours, cut at
        ``micro_batch_size`` sequences or ``micro_batch_tokens`` distinct prefix tokens
        (what the tree computes). ``auto`` takes this when the distinct tokens are at most
        ``prefix_sharing_max_ratio`` of the batch's tokens. Otherwise: samples sorted by
        length, cut at ``micro_batch_size`` sequences or ``micro_batch_tokens`` padded
        tokens: samples of similar length share a forward, so padding stays small."""
        o = self.options
        # Not under gradient checkpointing: the tree needs the KV cache it turns off.
        if o.prefix_sharing != "off" and self._head_only and not o.gradient_checkpointing:
            trees = tree_micro_batches(batch, o.micro_batch_size, o.micro_batch_tokens,
                                       1.0 if o.prefix_sharing == "on"
                                       else o.prefix_sharing_max_ratio)
            if trees is not None:
                return trees, True
        return self._padded_micro_batches(batch), False

    def _padded_micro_batches(self, batch: list[TrainSample]) -> list[list[TrainSample]]:
        o = self.options
        order = sorted(batch, key=lambda s: -len(s.input_ids))
        out: list[list[TrainSample]] = []
        cur: list[TrainSample] = []
        for s in order:
            width = len(cur[0].input_ids) if cur else len(s.input_ids)  # the longest (first)
            if cur and (len(cur) >= o.micro_batch_size
                        or width * (len(cur) + 1) > o.micro_batch_tokens):
                out.append(cur)
                cur = []
            cur.append(s)
        if cur:
            out.append(cur)
        return out

    def _logprobs(self, model: Any, t: dict[str, Any], sel: torch.Tensor,
                  entropy: bool, tree: PrefixTree | None = None,
                  mass: bool = False) -> tuple[torch.Tensor, float]:
        """Log-probs ``[B, T-1]`` of the tokens where ``sel`` is set (0 elsewhere) and the
        summed entropy there, in one pass: the LM head and softmax run only on the
        positions that are trained (the policy's tokens), not on every prompt token.
        With ``tree``, every shared prefix of the micro-batch is computed once.

        The log-probs are of the policy each sample was drawn from (its temperature and
        allowed ids, :func:`rollart_sdk.algorithms.policy_token_logprobs`), as the engine
        reported them, so the importance ratio compares like with like. ``mass``: the
        constrained positions' allowed mass (at the sample's temperature) goes to the
        step's :class:`~rollart_sdk.algorithms.AllowedMassMeter`."""
        head = model.get_output_embeddings() if self._head_only else None
        if tree is not None and head is not None:
            device = next(model.parameters()).device
            rows = torch.tensor(tree.rows, dtype=torch.long, device=device)
            at = torch.tensor(tree.sample_pos, dtype=torch.long, device=device)
            r, c = (at[:, 0], at[:, 1]) if len(tree.rows) else (rows, rows)
            logits = head(tree.hidden(model.base_model, rows))  # the trained tokens' rows
        elif head is None:  # a model with its own logit post-processing: full forward
            r, c = sel.nonzero(as_tuple=True)
            logits = model(input_ids=t["ids"], attention_mask=t["attn"]).logits[r, c]
        else:
            # Right padding under a causal mask: no real token ever attends to padding,
            # so no padding mask is needed, and attention takes the plain causal kernel.
            hidden = model.base_model(input_ids=t["ids"]).last_hidden_state
            r, c = sel.nonzero(as_tuple=True)
            logits = head(hidden[r, c])  # position t predicts token t + 1
        args = (logits, t["ids"][r, c + 1], t["temp"][r] if t["temp"] is not None else None,
                t["group"][r] if t["group"] is not None else None, t["allowed"], entropy)
        if mass and t["group"] is not None:
            picked, ent, log_mass = policy_token_logprobs(*args, allowed_mass=True)
            # each row's allowed ids as a share of the vocabulary (NaN: unconstrained)
            shares = [len(a) / logits.shape[-1] for a in t["allowed"]]
            self._mass.add(log_mass, [t["tag"][i] for i in r.tolist()],
                           [shares[g] if g >= 0 else float("nan")
                            for g in t["group"][r].tolist()])
        else:
            picked, ent = policy_token_logprobs(*args)
        logp = torch.zeros(sel.shape, dtype=picked.dtype, device=picked.device)
        return logp.index_put((r, c), picked), ent

    def _pad(self, mb: list[TrainSample]) -> dict[str, Any]:
        """Right-pad a micro-batch (causal attention: padding after a sequence never
        influences its tokens, and the loss mask is 0 there)."""
        n, length = len(mb), max(len(s.input_ids) for s in mb)
        ids = torch.full((n, length), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, length), dtype=torch.long)
        mask = torch.zeros((n, length), dtype=torch.float32)
        beh = torch.zeros((n, length), dtype=torch.float32)
        vers = torch.full((n, length), self._version, dtype=torch.long)
        for i, s in enumerate(mb):
            k = len(s.input_ids)
            ids[i, :k] = torch.tensor(s.input_ids, dtype=torch.long)
            attn[i, :k] = 1
            mask[i, :k] = torch.tensor(s.loss_mask, dtype=torch.float32)
            beh[i, :k] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            vers[i, :k] = torch.tensor(s.token_versions, dtype=torch.long)
        if any(s.advantage is None for s in mb):
            raise ValueError("a sample reached the loss without its advantage "
                             "(fill_advantages sets them before the micro-batches)")
        adv = torch.tensor([float(s.advantage or 0.0) for s in mb], dtype=torch.float32)
        out = {"ids": ids, "attn": attn, "mask": mask, "beh": beh, "vers": vers, "adv": adv}
        moved: dict[str, Any] = {k: v.to(self.device) for k, v in out.items()}
        # The sampled policy per sample (None where every sample has the raw one).
        temps = [policy_temperature(s.temperature) for s in mb]
        moved["temp"] = (torch.tensor(temps, dtype=torch.float32, device=self.device)
                         if any(x != 1.0 for x in temps) else None)
        groups, allowed = allowed_groups([s.allowed_token_ids for s in mb])
        moved["group"] = (torch.tensor(groups, dtype=torch.long, device=self.device)
                          if allowed else None)
        moved["allowed"] = [a.to(self.device) for a in allowed]
        moved["engine"] = [s.engine for s in mb]
        moved["tag"] = [s.tag for s in mb]
        return moved

