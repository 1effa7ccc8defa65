"""Trainer ``megatron``: one GRPO / PPO-clip optimiser step per batch, on megatron-core.

Layout: ``world_size = tensor_parallel_size * data_parallel_size`` ranks; ranks
``d*tp .. d*tp + tp - 1`` form data-parallel replica ``d`` (Megatron's default
``tp-cp-ep-dp-pp`` order). What one ``train_step`` does:

1. the ranks of a TP group pool their shards (``all_gather_object``), so each replica
   trains on the union of its ranks' shards; GRPO advantages are filled over the whole
   batch (rewards gathered over the DP group) when samples arrive without one;
2. trajectories are packed into rows of at most ``pack_length`` tokens, rows stacked into
   micro-batches of at most ``max_tokens_per_micro_batch`` tokens (packing.py), one
   forward/backward each;
3. per token, the objective trainer ``torch`` computes too
   (:func:`rollart_sdk.backends.objective.decoupled_ppo_objective`: decoupled PPO-clip,
   truncated IS on stale tokens, optional KL), each row's loss divided by the whole-batch
   token (or sequence) count over all replicas;
4. gradients summed over the DP group; Qwen3's q/k-norm gradients summed over the TP
   group (they see only the local heads); global norm over TP shards, clip, AdamW
   (with ``use_distributed_optimizer``: gradients reduce-scattered over the DP group and
   AdamW's state sharded across it, see distopt.py); for a bfloat16 / float16 model
   (``master_weights``, on by default there) AdamW steps fp32 master weights with fp32
   moments and the model takes them rounded, gradients are reduced in fp32, and float16
   scales the loss (``loss_scale``: Megatron's ``grad_scale_func``, a step whose gradients
   overflow is skipped): :mod:`rollart_sdk.backends.master_weights`;
5. ``version`` + 1.

Megatron's optimizer wrapper and pipeline schedules hard-code ``device='cuda'``, so this
loop is our own on CPU and GPU alike; its DDP wrapper is not needed for it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rollart_sdk.backends.distributed import (
    all_reduce_flat,
    all_reduce_small,
    check_rank,
    fill_advantages_across,
    init_process_group,
)
from rollart_sdk.backends.master_weights import LossScaler, MasterWeightsOptimizer
from rollart_sdk.config import ModelConfig
from rollart_sdk.interfaces import check_train_sample
from rollart_sdk.models import hf_checkpoint_path, resolve_device
from rollart_sdk.types import TrainSample, WeightBucket
from rollart_sdk.weights import split_buckets
from rollart_trainer_megatron import checkpoint as ckpt_io
from rollart_trainer_megatron.convert import (
    Arch,
    hf_to_megatron,
    is_replicated,
    megatron_names,
    megatron_to_hf,
)
from rollart_trainer_megatron.distopt import DistributedAdamW
from rollart_trainer_megatron.options import MegatronTrainerOptions
from rollart_trainer_megatron.packing import plan_micro_batches
from rollart_trainer_megatron.pipeline import Stage, device_mode, gather_stages, localize
from rollart_trainer_megatron.runtime import build_gpt, init_parallel, patch_for_cpu
from rollart_trainer_megatron.schedule import forward_backward


class MegatronTrainer:
    """Implements :class:`rollart_sdk.interfaces.Trainer` on a megatron-core GPTModel.

    ``model.path`` is a Hugging Face Llama / Qwen2 / Qwen3 checkpoint folder. With
    ``world_size > 1`` every rank builds one trainer with the same options and
    ``init_method``. ``export_weights``, ``save_checkpoint`` and ``save_pretrained`` are
    collective: every rank calls them (and drains ``export_weights``); rank 0's output
    is the one written or published, the others' buckets are the same.
    """

    export_needs_all_ranks = True  # TrainerWorker drains export_weights on ranks != 0

    def __init__(self, model: ModelConfig | str, rank: int = 0, world_size: int = 1,
                 init_method: str | None = None, **options: Any) -> None:
        from transformers import AutoConfig

        self.options = o = MegatronTrainerOptions.model_validate(options)
        self.rank, self.world_size = check_rank(rank, world_size)
        self.tp, self.pp = o.tensor_parallel_size, o.pipeline_parallel_size
        if self.world_size % (self.tp * self.pp):
            raise ValueError(
                f"world_size {self.world_size} (roles.actor_train.workers) is not a multiple "
                f"of trainer.options.tensor_parallel_size x pipeline_parallel_size = "
                f"{self.tp} x {self.pp}"
            )
        self.dp = self.world_size // (self.tp * self.pp)
        self.model_path = hf_checkpoint_path(model, 'megatron')
        dtype = getattr(torch, model.dtype) if isinstance(model, ModelConfig) else torch.float32
        if o.num_threads:
            torch.set_num_threads(o.num_threads)
        self.device = resolve_device(o.device, self.rank)
        self.cpu = self.device.type == "cpu"
        if self.cpu:
            patch_for_cpu()
        else:
            torch.cuda.set_device(self.device)
        self._init_distributed(init_method)
        random.seed(o.seed)
        init_parallel(self.tp, self.pp, o.seed, self.cpu)
        from megatron.core import parallel_state as ps

        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.mp_group = ps.get_model_parallel_group()  # TP x PP: one replica of the model
        self.dp_group = ps.get_data_parallel_group()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.dp_rank = ps.get_data_parallel_rank()
        self.embedding_group = (ps.get_embedding_group()
                                if self.pp > 1 and ps.is_rank_in_embedding_group() else None)

        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        problems = o.model_problems(self.hf_config.to_dict())  # what `validate` says first
        if problems:
            raise ValueError(f"trainer megatron cannot train {self.model_path}: "
                             + "; ".join(why for _, why in problems))
        self.arch = Arch.from_hf(self.hf_config, self.tp)
        self.stage = Stage.of(self.arch, self.pp, ps.get_pipeline_model_parallel_rank())
        self._global_names = self.stage.local_to_global(self.arch)
        hf_state = ckpt_io.read_hf_weights(self.model_path)
        local = localize(hf_to_megatron(hf_state, self.arch, self.tp, self.tp_rank),
                         self.arch, self.stage)
        del hf_state
        self.model = self._build(dtype, local)
        self.ref_model = None
        if o.kl_coef > 0:  # a frozen copy of the starting policy, only when the KL needs it
            self.ref_model = self._build(dtype, local).eval().requires_grad_(False)
        self.named_params = dict(self.model.named_parameters())
        self.params = list(self.named_params.values())
        # Megatron's own mixed-precision optimizers (Float16OptimizerWithFloat16Params,
        # DistributedOptimizer) allocate on device='cuda' and type-check for CUDA tensors:
        # the same fp32 masters and loss scaling come from rollart_sdk.backends.master_weights here.
        dtype_name = str(dtype).removeprefix("torch.")
        self.master_weights = o.uses_master_weights(dtype_name)
        dynamic, scale = o.loss_scaling(dtype_name)
        scaler = (LossScaler(scale, dynamic, o.loss_scale_growth_interval)
                  if dynamic or scale != 1.0 else None)
        self.optimizer: Any
        if o.use_distributed_optimizer:  # AdamW state sharded over the DP group (distopt.py)
            counted = [self._counted(n) for n in self.named_params]
            self.optimizer = DistributedAdamW(
                self.params, counted, self.dp_group, [self.mp_group], lr=o.lr, betas=o.betas,
                eps=o.eps, weight_decay=o.weight_decay, master_weights=self.master_weights,
                scaler=scaler)
        else:
            self.optimizer = MasterWeightsOptimizer(
                self.params,
                lambda params: torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps,
                                                 weight_decay=o.weight_decay),
                master_weights=self.master_weights, scaler=scaler,
                rounding=o.rounding(), seed=o.seed)
        self._grads: dict[str, torch.Tensor] = {}  # this step's gradients, by name
        # Megatron's schedules multiply each micro-batch's loss by this before backward.
        self.model.config.grad_scale_func = (self.optimizer.scale_loss if scaler is not None
                                             else None)
        self._version = 0
        self._step = 0

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        """Policy version: the number of optimiser steps taken."""
        return self._version

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """One AdamW step on ``batch`` (this rank's shard); returns whole-batch metrics."""
        o = self.options
        for i, s in enumerate(batch):
            check_train_sample(i, s)
        batch = self._pool_tp(batch)
        if not batch and self.dp == 1:
            raise ValueError("train_step got an empty batch")
        self._fill_advantages(batch)

        n_tokens = sum(sum(s.loss_mask[1:]) for s in batch)
        n_seqs = sum(1 for s in batch if any(s.loss_mask[1:]))
        counts = self._reduce(torch.tensor([n_tokens, n_seqs], dtype=torch.float64),
                              self.dp_group)
        normalizer = max(float(counts[0] if o.loss_agg == "token-mean" else counts[1]), 1.0)

        self.optimizer.zero_grad(set_to_none=True)
        lengths = [len(s.input_ids) for s in batch]
        plan = plan_micro_batches(lengths, o.pack_length or max(lengths, default=2),
                                  o.max_tokens_per_micro_batch, o.micro_batch_size)
        stats = forward_backward(self, batch, plan, normalizer)

        self._reduce_grads()
        stats.reduce(self._reduce_stages_and_replicas)  # only the last stage has losses
        sums, maxes = stats.sums, stats.maxima

        max_norm = o.grad_clip if o.grad_clip > 0 else math.inf
        for group in self.optimizer.param_groups:
            group["lr"] = o.lr_at(o.lr, self._step)
        loss_scale = self.optimizer.loss_scale  # the one this step's backward used
        if o.use_distributed_optimizer:  # reduce-scatter, norm, clip, sharded step, gather
            grad_norm, skipped = self.optimizer.step(max_norm)
        else:
            grad_norm = self._clip_grads(max_norm)
            # a non-finite gradient would poison AdamW's moments for good (float16: an
            # overflow, the loss scale backs off)
            skipped = not math.isfinite(grad_norm)
            self.optimizer.update_scale(not skipped)
            if not skipped:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._version += 1
        self._step += 1

        advs = [float(s.advantage or 0.0) for s in batch]
        return {
            **stats.metrics(o.compute_entropy),
            "grad_norm": grad_norm,
            # constrained tasks: mass the unmasked policy puts on the allowed ids
            **({"allowed_mass_mean": sums["allowed_mass"] / sums["allowed_rows"],
                "allowed_mass_min": 1.0 - maxes["allowed_gap"]}
               if sums["allowed_rows"] else {}),
            "tokens": sums["tokens"],
            "sequences": float(counts[1]),
            "micro_batches": float(len(plan)),
            "packed_rows": float(sum(len(rows) for rows in plan)),
            # reward/advantage means are of this replica's shard
            "reward_mean": sum(s.reward for s in batch) / max(len(batch), 1),
            "advantage_abs_mean": sum(abs(a) for a in advs) / max(len(advs), 1),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "skipped": float(skipped),
            "loss_scale": float(loss_scale),  # 1 without scaling (float16: dynamic)
            "version": float(self._version),
        }

    def export_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]:
        """This version's weights under Hugging Face names, gathered over the TP group
        tensor by tensor, as checksummed buckets. Collective: every rank must drain it."""
        return split_buckets(self.hf_tensors(), bucket_bytes, self._version)

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full CPU tensor) pairs of the current weights, the same on every rank
        (collective: gathered over the TP group, sent from the owning stage over PP)."""
        to_local = {g: n for n, g in self._global_names.items()
                    if not self.stage.is_tied_copy(n, self.arch)}
        for name in megatron_names(self.arch):
            owner = self.stage.owner(name)
            mine = None
            if owner == self.stage.rank:
                local = self.named_params[to_local[name]].detach()
                if self.tp == 1 or is_replicated(name):
                    shards = [local]
                else:
                    shards = [torch.empty_like(local) for _ in range(self.tp)]
                    dist.all_gather(shards, local.contiguous(), group=self.tp_group)
                mine = [(hf_name, tensor.to("cpu", copy=True).contiguous())
                        for hf_name, tensor in megatron_to_hf(name, shards, self.arch)]
            if self.pp == 1:
                yield from mine or []
            else:  # the owner stage sends the converted tensors to the other stages
                yield from gather_stages(mine, owner, self.pp_group)

    def save_checkpoint(self, path: str) -> None:
        """Model and AdamW state in Megatron's distributed checkpoint format (each rank
        writes its shards), then step/version/RNG state. Collective."""
        ckpt_io.save(self, path)

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same TP size). Collective."""
        ckpt_io.load(self, path)

    def save_pretrained(self, path: str) -> None:
        """A Hugging Face checkpoint folder (``from_pretrained`` loads it), tokenizer files
        copied along. Collective: every rank gathers, rank 0 writes."""
        ckpt_io.save_pretrained(self, path)

    def close(self) -> None:
        """Leave the process groups (if this trainer created them)."""
        if dist.is_initialized():
            dist.barrier()
            from megatron.core import parallel_state as ps

            ps.destroy_model_parallel()
            dist.destroy_process_group()

    # ------------------------------------------------------------------ internals

    def _build(self, dtype: torch.dtype, local: dict[str, torch.Tensor]) -> Any:
        with device_mode(self.cpu):  # tied embeddings under PP: Megatron calls .cuda()
            model = build_gpt(self.hf_config, self.arch, self.tp, self.pp, dtype, self.cpu,
                              self.stage.first, self.stage.last)
        model.config.variable_seq_lengths = True  # packed micro-batches differ in shape
        model.config.calculate_per_token_loss = True  # losses arrive normalised (schedule.py)
        model.config.batch_p2p_comm = False
        params = dict(model.named_parameters())
        if set(params) != set(local):
            raise ValueError(
                f"{self.model_path}: the Megatron model and the converted checkpoint differ: "
                f"missing {sorted(set(params) - set(local))[:5]}, "
                f"unexpected {sorted(set(local) - set(params))[:5]}"
            )
        with torch.no_grad():
            for name, p in params.items():
                if p.shape != local[name].shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(local[name].shape)} "
                                     f"!= model shape {tuple(p.shape)}")
                p.copy_(local[name])
        return model.to(self.device).train()

    def _init_distributed(self, init_method: str | None) -> None:
        # megatron-core needs a process group even for one rank
        init_process_group(self.rank, self.world_size, init_method, self.options.dist_backend,
                           not self.cpu, timeout=timedelta(minutes=10), what="parallelism")

    def _reduce(self, t: torch.Tensor, group: Any, op: str = "sum") -> torch.Tensor:
        return all_reduce_small(t, self.device, group, op)

    def _reduce_stages_and_replicas(self, t: torch.Tensor, op: str) -> torch.Tensor:
        for group in (self.pp_group, self.dp_group):
            t = self._reduce(t, group, op)
        return t

    def _pool_tp(self, batch: list[TrainSample]) -> list[TrainSample]:
        """The union of the shards given to the ranks of this replica (its TP x PP group),
        in rank order: every rank of a replica trains on the same batch."""
        n = self.tp * self.pp
        if n == 1:
            return batch
        parts: list[Any] = [None] * n
        dist.all_gather_object(parts, batch, group=self.mp_group)
        return [s for part in parts for s in part]

    def _fill_advantages(self, batch: list[TrainSample]) -> None:
        """Advantages (`adv_estimator`) for samples without one, over the batch of *all*
        replicas."""
        fill_advantages_across(batch, self.options.adv_eps, self.options.adv_normalize_std,
                               self.device, size=self.dp, rank=self.dp_rank,
                               group=self.dp_group, estimator=self.options.adv_estimator)

    def _reduce_grads(self) -> None:
        """Sum gradients over the DP group (flat, one collective); sum the q/k-norm
        gradients over the TP group (each TP rank saw only its own heads). Without the
        distributed optimizer these are the optimizer's main gradients (fp32 and unscaled
        under master weights); with it, the parameters' own (it reduce-scatters them in
        fp32 and unscales them itself)."""
        if self.options.use_distributed_optimizer:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self._grads = {n: p.grad for n, p in self.named_params.items()}
        else:
            self._grads = dict(zip(self.named_params, self.optimizer.main_grads(), strict=True))
        grads = self._grads
        if self.tp > 1 and self.arch.qk_norm:
            qk = [g for n, g in grads.items()
                  if n.endswith(("q_layernorm.weight", "k_layernorm.weight"))]
            all_reduce_flat(qk, self.tp_group)
        if self.embedding_group is not None and self.arch.tied:
            # the tied embedding's two copies (first and last stage): one gradient, summed
            shared = grads["embedding.word_embeddings.weight" if self.stage.first
                           else "output_layer.weight"]
            all_reduce_flat([shared], self.embedding_group)
        if self.dp > 1 and not self.options.use_distributed_optimizer:
            all_reduce_flat(list(grads.values()), self.dp_group)

    def _counted(self, name: str) -> bool:
        """Whether parameter ``name`` enters the global grad norm on this rank (a
        TP-replicated one only on TP rank 0, a tied embedding's copy only once)."""
        if self.stage.is_tied_copy(name, self.arch):
            return False
        return self.tp_rank == 0 or not is_replicated(name)

    def _clip_grads(self, max_norm: float) -> float:
        """Global L2 norm over the whole model (TP / PP shards counted once), clip."""
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, g in self._grads.items():
            if self._counted(name):
                sq += g.detach().double().pow(2).sum()
        total = float(self._reduce(sq.reshape(1), self.mp_group)[0].sqrt())
        if math.isfinite(total) and total > max_norm:
            coef = max_norm / (total + 1e-6)
            for g in self._grads.values():
                g.mul_(coef)
        return total

