"""``rollart bench small --modes trl``: Hugging Face TRL's real GRPOTrainer on the workload.

These tests need ``trl`` (not a rollart dependency): ``scripts/ci_trl.sh`` runs them in a
venv with ``trl==1.16.0``; elsewhere they are skipped. The point they check is that the
plain-torch reference (``small_reference``) and TRL do the same update, so the reference's
figures stand for TRL's on the same machine.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("trl")


def _fixed_batch(seed: int = 1):
    """The workload's model and one real lockstep rollout of it (seed 1, step 0), with
    rewards that vary inside every group (the first rollouts of the tiny model rarely
    succeed, and a batch without variance makes no update)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from rollart_benchmark_suite.small_reference import GROUP_SIZE, _rollout, setup

    s = setup("none", seed, 4)
    pool = ThreadPoolExecutor(max_workers=len(s["envs"]))
    try:
        with torch.no_grad():
            seqs, masks, _, _, _ = _rollout(s["model"], s["chat"], s["envs"], pool,
                                            s["allowed"], s["gen"], s["max_turns"],
                                            seed * 100_003)
    finally:
        pool.shutdown(wait=False)
    # group g: its first g % 4 + 1 episodes succeed (1 to 4 of 8: every group varies)
    rewards = [1.0 if i % GROUP_SIZE <= (i // GROUP_SIZE) % 4 else 0.0
               for i in range(len(seqs))]
    return s, seqs, masks, rewards


def _reference_update(model, seqs, masks, rewards, updates, lr, sgd=False):
    import torch
    from rollart_benchmark_suite.small_reference import _train_step

    m = copy.deepcopy(model)
    if sgd:  # the weights move by lr * the loss's gradient, unclipped
        _train_step(m, torch.optim.SGD(m.parameters(), lr=lr), seqs, masks, rewards, updates,
                    max_grad_norm=float("inf"))
        return m
    opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    _train_step(m, opt, seqs, masks, rewards, updates)
    return m


def _delta(a, b):  # the weights' difference, all parameters as one vector
    import torch

    return torch.cat([(p.detach() - q.detach()).flatten()
                      for p, q in zip(a.parameters(), b.parameters(), strict=True)])


@pytest.mark.parametrize("updates", [1, 2])
def test_reference_update_is_trls(tmp_path, updates):
    """One generation batch through TRL's GRPOTrainer (DAPO, group scaling, grad clip 1,
    ``num_iterations=updates``) and through small_reference's ``_train_step``: the same
    weights after, to float32 rounding. A reference that weighted tokens or groups
    differently, or clipped differently in the second update, would differ by about the
    size of the update itself (the control below)."""
    from rollart_benchmark_suite import small_trl

    s, seqs, masks, rewards = _fixed_batch()
    before = copy.deepcopy(s["model"])
    ref = _reference_update(before, seqs, masks, rewards, updates, s["lr"])

    calls = []

    def rollout(prompts, trainer):
        calls.append(len(prompts))
        return small_trl.trl_batch(seqs, masks, rewards)

    trainer = small_trl.build_trainer(s, rollout, str(tmp_path), 1, 1, updates)
    trainer.train()
    assert calls == [64]  # one generation batch, reused for every update (num_iterations)
    assert trainer.state.global_step == updates

    step = _delta(ref, before)
    # the update moved the weights (about the workload's lr, 5e-4, per AdamW step)
    assert step.abs().max() > 0.5 * s["lr"]
    # Adam's first step is about lr * sign(g): float noise flips the sign of a few
    # near-zero gradient entries (4e-5 of them here), so the norm, not the max, is compared.
    assert _delta(s["model"], ref).norm() < 1e-3 * step.norm()
    # control: the reference on other rewards (one group's flipped) lands elsewhere
    other = list(rewards)
    other[:8] = [1.0 - r for r in other[:8]]
    assert _delta(_reference_update(before, seqs, masks, other, updates, s["lr"]),
                 ref).norm() > 0.1 * step.norm()

def test_reference_loss_is_trls(tmp_path):
    """The loss itself, scale included: with plain SGD and no clipping the weights move by
    lr times the gradient, so a reference whose loss differed from TRL's by any factor (a
    token count over other rows, a mean per sequence instead of DAPO's per token) fails
    here even where Adam's normalisation would hide it."""
    from rollart_benchmark_suite import small_trl

    s, seqs, masks, rewards = _fixed_batch()
    before = copy.deepcopy(s["model"])
    lr = 0.1
    ref = _reference_update(before, seqs, masks, rewards, 1, lr, sgd=True)
    trainer = small_trl.build_trainer(
        s, lambda prompts, trainer: small_trl.trl_batch(seqs, masks, rewards), str(tmp_path),
        1, 1, 1, optim="sgd", learning_rate=lr, max_grad_norm=1e9)
    trainer.train()
    step = _delta(ref, before)
    assert step.norm() > 1e-3
    assert _delta(s["model"], ref).norm() < 1e-4 * step.norm()
    # control: the same gradient at 0.9 of the scale is told apart
    scaled = _reference_update(before, seqs, masks, rewards, 1, 0.9 * lr, sgd=True)
    assert _delta(scaled, ref).norm() > 0.05 * step.norm()


def test_trl_mode_runs_and_is_summarized(tmp_path):
    """``--modes trl``'s child: a real TRL run of 2 steps in the bench's row format (the
    rollout's prompt/completion split and env mask accepted by TRL)."""
    from rollart_benchmark_suite.small import summarize
    from rollart_benchmark_suite.small_trl import trl_child

    data = trl_child("none", 0, 2, str(tmp_path / "unused.json"))
    assert len(data["metrics"]) == 2
    assert data["t_start"] < data["t_ready"] < data["metrics"][0]["t"]
    row = summarize("trl", "none", 0, data["t_start"], data)
    assert row["mode"] == "trl" and row["seed"] == 0
    assert row["steps_to_target"] is None and not row["reached"]
    assert all(m["train_tokens"] > 64 for m in data["metrics"])  # at least one action each


def test_trl_batch_splits_at_the_first_action():
    from rollart_benchmark_suite.small_trl import trl_batch

    b = trl_batch([[5, 6, 7, 8, 9]], [[0, 0, 1, 0, 1]], [1.0])
    assert b["prompt_ids"] == [[5, 6]] and b["completion_ids"] == [[7, 8, 9]]
    assert b["env_mask"] == [[1, 0, 1]] and b["success"] == [True]
    with pytest.raises(RuntimeError, match="episode 0 has no action token"):
        trl_batch([[5, 6]], [[0, 0]], [0.0])
