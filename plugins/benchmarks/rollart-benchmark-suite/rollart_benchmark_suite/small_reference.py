"""A synchronous single-process GRPO trainer for the ``rollart bench small`` workload.

The baseline of issue 12 was Hugging Face TRL's GRPOTrainer with a batched multi-turn
rollout, measured once and quoted as figures. This module is that kind of trainer written
out in plain torch, so the comparison can be re-run on the same machine, with the same
seeds, next to rollart's runs (``rollart bench small --reference``):

- the same checkpoint (the tiny Llama built by ``rollart_sdk.models.prepare_model`` from the
  workload's ``model.tiny`` and the action words), tokenizer and token layout (the same
  :class:`~rollart_sdk.control.chat.ChatFormat`: first prompt, then per turn the action
  token and the next observation's tokens), the same env class and options, the same
  reward (1 when the env reports success), 8 groups of 8 episodes per step;
- rollout as TRL's batched multi-turn loop does it: the 64 episodes of a step advance in
  lockstep, one batched forward per turn over every row with the KV cache kept between
  turns (HF ``past_key_values``; a row whose episode ended keeps feeding a copy of its
  last tokens and is ignored), actions sampled among the four action tokens at
  temperature 1, then every live env steps at once on threads and the turn waits for the
  slowest (the per-turn barrier that env latency costs a batched trainer);
- the update as TRL's defaults (``loss_type="dapo"``, ``scale_rewards="group"``,
  ``beta=0``, one update per batch, ``max_grad_norm=1``): advantages ``(r - mean_g) /
  (std_g + 1e-4)`` (Bessel std), token-level loss ``-sum(A * ratio) / tokens`` with ratio
  ``exp(logp - logp.detach())`` (1, on-policy), AdamW at the workload's lr (5e-4), betas (0.9, 0.999), no
  weight decay, constant lr. Samples whose advantage is 0 are not run through the model
  (their gradient is exactly 0; the token count still includes them), as rollart does.
  ``updates`` > 1 is TRL's ``num_iterations``: later AdamW steps on the same batch with
  ratio ``exp(logp - logp_first_pass)`` clipped at ``1 +- 0.2`` (TRL's ``epsilon``), the
  same as rollart's ``trainer.options.updates_per_batch``.

It reports what ``rollart_benchmark_suite.small.summarize`` reads, so both kinds of run go
through one summary.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

GROUPS = 8
GROUP_SIZE = 8
ADV_EPS = 1e-4  # TRL's
CLIP_EPS = 0.2  # TRL's epsilon (PPO clip), used from a batch's second update on


def setup(latency: str, seed: int, max_steps: int) -> dict[str, Any]:
    """What a run of this trainer (and of TRL's, :mod:`small_trl`) starts from: the
    workload's model (transformers', which this loop's KV cache feeds, as TRL's does) and
    tokenizer, chat format, action tokens, 64 envs, the sampling generator, max turns, lr."""
    import torch

    from rollart_benchmark_suite.latency_env import LatencyFrozenLake
    from rollart_benchmark_suite.small import LATENCY, workload_config
    from rollart_sdk.config import ModelConfig
    from rollart_sdk.control.chat import ChatFormat
    from rollart_sdk.models import load_causal_lm, load_tokenizer, prepare_model

    torch.set_num_threads(int(os.environ.get("ROLLART_TORCH_THREADS", "1")))
    wl = workload_config("sync", latency, seed, "/unused", max_steps)
    env_opts = dict(wl["tasks"][0]["env"]["options"])
    mu, sigma = LATENCY[latency]
    env_opts.update(mu=mu, sigma=sigma)
    with tempfile.TemporaryDirectory(prefix="rollart-bench-small-ref-") as tmp:
        from rollart_env_frozenlake.env import ACTIONS

        model_cfg = prepare_model(ModelConfig(**wl["model"]), tmp, sorted(ACTIONS))
        assert model_cfg.path is not None
        tok = load_tokenizer(model_cfg.path)
        model = load_causal_lm(model_cfg.path, implementation="transformers").train()
    chat = ChatFormat(tok)
    return {"tok": tok, "model": model, "chat": chat,
            "allowed": torch.tensor(chat.action_token_ids(list(ACTIONS))),
            "envs": [LatencyFrozenLake(**env_opts) for _ in range(GROUPS * GROUP_SIZE)],
            "gen": torch.Generator().manual_seed(seed),
            "max_turns": int(wl["tasks"][0]["max_turns"]),
            "lr": float(wl["trainer"]["options"]["lr"])}


def reference_child(latency: str, seed: int, max_steps: int, out: str,
                    updates: int = 1) -> dict[str, Any]:
    """One reference run in this process; returns what ``summarize`` reads. ``updates``:
    AdamW steps per batch (TRL's ``num_iterations``)."""
    t_start = time.time()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from rollart_benchmark_suite.small import TAG, TARGET, WINDOW

    s = setup(latency, seed, max_steps)
    model, chat, envs, allowed, gen = s["model"], s["chat"], s["envs"], s["allowed"], s["gen"]
    max_turns, n = s["max_turns"], len(s["envs"])
    pool = ThreadPoolExecutor(max_workers=n)
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    t_ready = time.time()
    cpu_ready = time.process_time()
    metrics: list[dict[str, Any]] = []
    for step in range(max_steps):
        t0 = time.time()
        seqs, masks, rewards, turns, floor = _rollout(model, chat, envs, pool, allowed, gen,
                                                      max_turns, seed * 100_003 + step)
        t1 = time.time()
        train = _train_step(model, opt, seqs, masks, rewards, updates)
        t2 = time.time()
        succ = sum(rewards) / n
        metrics.append({
            "t": t2, "cpu": time.process_time(), f"success/{TAG}": succ, f"count/{TAG}": n,
            f"turns/{TAG}": sum(turns) / n, "time/get_batch_wait": t1 - t0,
            "time/train": t2 - t1, "time/weight_sync": 0.0, "train_tokens": train["tokens"],
            "trajectories/aborted_stale": 0,
            # lockstep: every turn waits for its slowest live env (the floor of this rollout)
            "slowest_episode_sleep_s": floor, "episode_sleep_s_sum": 0.0,
        })
        window = [m[f"success/{TAG}"] for m in metrics[-WINDOW:]]
        if len(window) == WINDOW and sum(window) / WINDOW >= TARGET:
            break
    pool.shutdown(wait=False)
    return {"t_start": t_start, "t_ready": t_ready, "metrics": metrics, "cpu_ready": cpu_ready,
            "engine": {}}


def _rollout(model: Any, chat: Any, envs: list[Any], pool: ThreadPoolExecutor, allowed: Any,
             gen: Any, max_turns: int, env_seed_base: int
             ) -> tuple[list[list[int]], list[list[int]], list[float], list[int], float]:
    """64 episodes in lockstep, KV cache kept across turns; returns per episode the token
    ids, the loss mask (1 on action tokens), the reward and the number of turns, and the
    latency floor of the rollout (per turn the slowest live env's sleep, summed)."""
    import torch

    n = len(envs)
    # One env seed per group (FrozenLake's fixed map ignores it; kept for other maps).
    resets = list(pool.map(lambda i: envs[i].reset(seed=env_seed_base + i // GROUP_SIZE),
                           range(n)))
    seqs = [chat.first_prompt(obs, None) for obs, _ in resets]
    masks = [[0] * len(s) for s in seqs]
    alive = [True] * n
    success = [False] * n
    turns = [0] * n
    feed = [list(s) for s in seqs]  # what each row feeds this turn
    past = None
    floor = 0.0
    model.eval()
    with torch.no_grad():
        for turn in range(max_turns):
            width = {len(f) for f in feed}
            if len(width) != 1:
                raise RuntimeError(f"rows feed different lengths {sorted(width)}: this reference "
                                   "rollout needs equal-length observations (compact FrozenLake)")
            out = model(input_ids=torch.tensor(feed), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()[:, allowed]  # the four action tokens
            picks = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)[:, 0]
            acts = [int(allowed[int(p)]) for p in picks]
            live = [i for i in range(n) if alive[i]]
            steps = [(envs[i], chat.decode([acts[i]])) for i in live]
            results = dict(zip(live, pool.map(lambda e: e[0].step(e[1]), steps), strict=True))
            floor += max(float(r[4].get("last_sleep_s", 0.0)) for r in results.values())
            next_feed: list[list[int] | None] = []
            for i in range(n):
                if not alive[i]:
                    next_feed.append(None)
                    continue
                seqs[i].append(acts[i])
                masks[i].append(1)
                turns[i] += 1
                obs, _reward, terminated, truncated, info = results[i]
                if terminated or truncated or turn == max_turns - 1:
                    alive[i] = False  # (after the last turn no next observation is fed)
                    success[i] = bool(info.get("success"))
                    next_feed.append(None)
                    continue
                nxt = chat.next_observation(obs, [acts[i]])
                seqs[i] += nxt
                masks[i] += [0] * len(nxt)
                next_feed.append([acts[i]] + nxt)
            if not any(alive):
                break
            width_live = len(next(f for f in next_feed if f is not None))
            feed = [f if f is not None else [0] * width_live for f in next_feed]
    model.train()
    return seqs, masks, [1.0 if s else 0.0 for s in success], turns, floor


def _advantages(rewards: list[float]) -> list[float]:
    adv = []
    for g in range(0, len(rewards), GROUP_SIZE):
        r = rewards[g:g + GROUP_SIZE]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / max(1, len(r) - 1))
        adv += [(x - mean) / (std + ADV_EPS) for x in r]
    return adv


def _train_step(model: Any, opt: Any, seqs: list[list[int]], masks: list[list[int]],
                rewards: list[float], updates: int = 1,
                max_grad_norm: float = 1.0) -> dict[str, float]:
    import torch

    adv = _advantages(rewards)
    tokens = sum(sum(m[1:]) for m in masks)  # DAPO: every completion token of the batch
    run = [i for i, a in enumerate(adv) if a != 0.0]
    batch = None
    if run:
        width = max(len(seqs[i]) for i in run)
        ids = torch.tensor([seqs[i] + [0] * (width - len(seqs[i])) for i in run])
        mask = torch.tensor([masks[i] + [0] * (width - len(masks[i])) for i in run],
                            dtype=torch.float32)[:, 1:]
        a = torch.tensor([adv[i] for i in run], dtype=torch.float32)[:, None]
        batch = (ids, mask, a)
    old = None
    for _ in range(updates):
        opt.zero_grad(set_to_none=True)
        if batch is not None:
            ids, mask, a = batch
            logits = model(input_ids=ids).logits[:, :-1].float()
            logp = logits.gather(-1, ids[:, 1:, None])[..., 0] - torch.logsumexp(logits, dim=-1)
            if old is None:  # the first update: on-policy, ratio 1 (nothing to clip)
                old = logp.detach()
                per_token = a * torch.exp(logp - old)
            else:  # later ones: PPO's clipped surrogate against the first pass
                ratio = torch.exp(logp - old)
                per_token = torch.minimum(ratio * a,
                                          ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * a)
            loss = -(per_token * mask).sum() / max(tokens, 1)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
    return {"tokens": float(tokens)}
