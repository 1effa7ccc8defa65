"""The ``rollart bench small`` workload trained by Hugging Face TRL's real ``GRPOTrainer``.

:mod:`rollart_benchmark_suite.small_reference` is TRL's loop written out in plain torch; this
module runs the same workload through TRL itself (``trl==1.16.0``; it is not a rollart
dependency, install it in a separate environment), so the benchmark can measure TRL on
this machine next to rollart instead of quoting figures.

What is TRL's: the whole update. ``GRPOTrainer`` (on transformers' ``Trainer`` and
accelerate) builds the batch from the generations, calls the reward function, computes
the group-normalised advantages (``scale_rewards="group"``, ``(r - mean) / (std + 1e-4)``),
the old log-probs when ``num_iterations`` > 1, the DAPO token-mean clipped surrogate
(``loss_type="dapo"``, ``epsilon=0.2``, ``beta=0``, fused LM head log-probs at temperature
1), runs backward, clips the grad norm at 1 and steps its optimizer (transformers'
default ``adamw_torch_fused``, the workload's lr (5e-4) constant, betas (0.9, 0.999), eps 1e-8, no weight
decay) and scheduler; ``num_iterations`` = ``updates`` reuses one generation batch for
that many optimizer steps (TRL's buffered batches).

What is ours: the rollout. Generation is plugged in with TRL's ``rollout_func`` argument
(``GRPOTrainer(rollout_func=...)``, experimental in TRL, honoured without vLLM): it calls
``small_reference._rollout`` (64 episodes in lockstep, one batched forward per turn with
HF ``past_key_values``, actions sampled among the four action tokens at temperature 1,
env steps on threads) on the trainer's own model, with the reference's generator, env
seeds and setup, so a run draws what the reference run of the same seed draws as long as
the weights agree. Each episode goes back as ``prompt_ids`` (the first prompt),
``completion_ids`` (the action and observation tokens after it), ``env_mask`` (TRL's
name for a rollout's mask of model tokens: 1 on actions, 0 on observation tokens, which
TRL then leaves out of the loss and of the DAPO token count) and ``success`` (an extra
field TRL forwards to the reward function, which returns 1.0 on success). The dataset is
8 prompts, one per group, that TRL's sampler repeats ``num_generations`` = 8 times: rows
8g..8g+7 are group g, as in the reference.

Configuration: 8 prompts x 8 generations = 64 completions per generation batch,
``per_device_train_batch_size=64``, ``gradient_accumulation_steps=1``,
``steps_per_generation=1``: one optimizer step on the whole batch per update, ``updates``
of them per batch. A step of this module's metrics is one generation batch (``updates``
optimizer steps, TRL's ``max_steps`` = ``max_steps * updates``). A callback records each
step and stops training at the target. Start-up (``t_ready``) ends at TRL's
``on_train_begin``; the rollout's env seed uses the batch index, as the reference does.

Deviations from TRL's defaults, and why:

- ``gradient_checkpointing=False`` (TRL defaults to True): a 0.36M-parameter model has
  no activation memory worth saving; recomputing the forward would only add time, and
  the plain-torch reference does not do it. ``bf16=False`` (TRL defaults to True where
  supported): the workload trains in float32 on the CPU (``use_cpu=True``).
- ``learning_rate`` the workload's (5e-4), ``lr_scheduler_type="constant"``, ``warmup_steps=0``,
  ``weight_decay=0``, ``max_grad_norm=1`` (transformers' defaults: 1e-6 in TRL, linear
  decay): the workload's optimizer settings.
- ``shuffle_dataset=False``: the 8 prompts only label the groups (the rollout builds the real
  prompt from the env), so the order only has to keep the group structure.
- the rollout returns ``logprobs=None``: TRL uses sampling log-probs only for vLLM's
  importance-sampling correction (off here), and the reference rollout does not keep them.
- logging, saving, evaluation and progress bars off; output in a temporary folder.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rollart_benchmark_suite.small_reference import CLIP_EPS, GROUP_SIZE, GROUPS, _rollout, setup


class _Rollout:
    """TRL's ``rollout_func``: one lockstep rollout of ``small_reference`` per generation
    batch, in TRL's output format; keeps each batch's figures for the step record."""

    def __init__(self, chat: Any, envs: list[Any], pool: ThreadPoolExecutor, allowed: Any,
                 gen: Any, max_turns: int, seed: int, updates: int) -> None:
        self.chat, self.envs, self.pool, self.allowed, self.gen = chat, envs, pool, allowed, gen
        self.max_turns, self.seed, self.updates = max_turns, seed, updates
        self.last: dict[str, Any] = {}

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        n = GROUPS * GROUP_SIZE
        if len(prompts) != n:
            raise RuntimeError(f"expected {n} prompts (8 groups x 8), got {len(prompts)}")
        step = trainer.state.global_step // self.updates  # the batch index
        t0 = time.time()
        seqs, masks, rewards, turns, floor = _rollout(
            trainer.model, self.chat, self.envs, self.pool, self.allowed, self.gen,
            self.max_turns, self.seed * 100_003 + step)
        t1 = time.time()
        self.last = {"t0": t0, "t1": t1, "rewards": rewards, "turns": turns, "floor": floor,
                     "tokens": float(sum(sum(m) for m in masks))}
        return trl_batch(seqs, masks, rewards)


def trl_batch(seqs: list[list[int]], masks: list[list[int]],
              rewards: list[float]) -> dict[str, Any]:
    """A lockstep rollout's episodes (token ids, the 1-on-action-tokens mask, rewards) in
    the format TRL's ``rollout_func`` returns: the prompt is everything before the first
    action token, the completion the rest, ``env_mask`` its mask."""
    prompt_len = []
    for i, m in enumerate(masks):
        if 1 not in m:
            raise RuntimeError(f"episode {i} has no action token (mask {m}): the rollout "
                               f"must take at least one action per episode")
        prompt_len.append(m.index(1))
    return {
        "prompt_ids": [s[:p] for s, p in zip(seqs, prompt_len, strict=True)],
        "completion_ids": [s[p:] for s, p in zip(seqs, prompt_len, strict=True)],
        "logprobs": None,
        "env_mask": [m[p:] for m, p in zip(masks, prompt_len, strict=True)],
        "success": [r > 0 for r in rewards],
    }


def success_reward(prompts: list[Any], completions: list[Any], success: list[bool],
                   **_: Any) -> list[float]:
    """The workload's reward: 1 when the env reported success."""
    return [1.0 if s else 0.0 for s in success]


def _callback(rollout: _Rollout, updates: int, metrics: list[dict[str, Any]],
              ready: dict[str, float]) -> Any:
    from transformers import TrainerCallback

    from rollart_benchmark_suite.small import TAG, TARGET, WINDOW

    class StepRecord(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ready.update(t=time.time(), cpu=time.process_time())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % updates:
                return  # a batch's earlier update: the step ends with its last one
            r, t2 = rollout.last, time.time()
            n = len(r["rewards"])
            metrics.append({
                "t": t2, "cpu": time.process_time(), f"success/{TAG}": sum(r["rewards"]) / n,
                f"count/{TAG}": n, f"turns/{TAG}": sum(r["turns"]) / n,
                "time/get_batch_wait": r["t1"] - r["t0"], "time/train": t2 - r["t1"],
                "time/weight_sync": 0.0, "train_tokens": r["tokens"],
                "trajectories/aborted_stale": 0,
                "slowest_episode_sleep_s": r["floor"], "episode_sleep_s_sum": 0.0,
            })
            window = [m[f"success/{TAG}"] for m in metrics[-WINDOW:]]
            if len(window) == WINDOW and sum(window) / WINDOW >= TARGET:
                control.should_training_stop = True

    return StepRecord()


def grpo_config(output_dir: str, seed: int, max_steps: int, updates: int, lr: float,
                **changes: Any) -> Any:
    """TRL's config for the workload (see the module docstring for each choice);
    ``changes``: other GRPOConfig values (tests)."""
    from trl import GRPOConfig

    n = GROUPS * GROUP_SIZE
    values: dict[str, Any] = dict(
        output_dir=output_dir, seed=seed, data_seed=seed, max_steps=max_steps * updates,
        per_device_train_batch_size=n, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=GROUP_SIZE, num_iterations=updates, shuffle_dataset=False,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=CLIP_EPS,
        temperature=1.0, max_completion_length=512,
        bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False,
        report_to="none", save_strategy="no", eval_strategy="no", logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0,
    )
    return GRPOConfig(**{**values, **changes})


def build_trainer(s: dict[str, Any], rollout: Any, output_dir: str, seed: int, max_steps: int,
                  updates: int, callbacks: list[Any] | None = None, **changes: Any) -> Any:
    """TRL's GRPOTrainer on ``s``'s model with ``rollout`` as its ``rollout_func``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOTrainer

    dataset = Dataset.from_dict({"prompt": [f"group {g}" for g in range(GROUPS)]})
    return GRPOTrainer(model=s["model"], reward_funcs=success_reward,
                       args=grpo_config(output_dir, seed, max_steps, updates, s["lr"],
                                        **changes),
                       train_dataset=dataset, processing_class=s["tok"],
                       rollout_func=rollout, callbacks=callbacks)


def trl_child(latency: str, seed: int, max_steps: int, out: str,
              updates: int = 1) -> dict[str, Any]:
    """One TRL run in this process; returns what ``small.summarize`` reads (the keys of
    ``small_reference.reference_child``). ``updates``: TRL's ``num_iterations``."""
    t_start = time.time()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    s = setup(latency, seed, max_steps)
    pool = ThreadPoolExecutor(max_workers=len(s["envs"]))
    rollout = _Rollout(s["chat"], s["envs"], pool, s["allowed"], s["gen"], s["max_turns"],
                       seed, updates)
    metrics: list[dict[str, Any]] = []
    ready: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rollart-bench-small-trl-out-") as tmp:
        trainer = build_trainer(s, rollout, tmp, seed, max_steps, updates,
                                [_callback(rollout, updates, metrics, ready)])
        trainer.train()
    pool.shutdown(wait=False)
    return {"t_start": t_start, "t_ready": ready["t"], "metrics": metrics,
            "cpu_ready": ready["cpu"], "engine": {}}


if __name__ == "__main__":  # python -m rollart_benchmark_suite.small_trl latency seed max_steps out [updates]
    import json
    from pathlib import Path

    _latency, _seed, _steps, _out = sys.argv[1:5]
    _updates = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    Path(_out).write_text(json.dumps(trl_child(_latency, int(_seed), int(_steps), _out,
                                               _updates)))
