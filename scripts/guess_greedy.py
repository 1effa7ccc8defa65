"""Play a trained guess-the-number model greedily against every secret (its decision tree).

    python scripts/guess_greedy.py RUN_DIR [--low 1 --high 8 --turns 3]

Loads ``RUN_DIR/final_model``, renders each turn with the model's chat template (as the
engine does; the first turn's token ids are compared with those in ``samples.jsonl``),
takes the most likely number among the allowed ones, and prints one line per secret.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _reset_to(env, secret: int) -> str:
    for seed in range(10_000):
        obs, info = env.reset(seed=seed)
        if info["answer"] == str(secret):
            return obs
    raise SystemExit(f"no reset seed below 10000 draws secret {secret}")


def main() -> None:
    import torch
    from rollart_env_arithmetic import GuessEnv
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--low", type=int, default=1)
    ap.add_argument("--high", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.run_dir / "final_model")
    model = AutoModelForCausalLM.from_pretrained(args.run_dir / "final_model").eval()
    env = GuessEnv(low=args.low, high=args.high, turns=args.turns, show_range=True)
    words = list(env.action_vocabulary or [])
    allowed = [tok.convert_tokens_to_ids(w) for w in words]
    first = json.loads((args.run_dir / "samples.jsonl").open().readline())["turns"][0]
    wins = 0
    for secret in range(args.low, args.high + 1):
        msgs, path, obs = [], [], _reset_to(env, secret)
        while True:
            msgs.append({"role": "user", "content": obs})
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if len(msgs) == 1 and ids != first["observation_ids"]:
                raise SystemExit("the first turn renders differently from the engine's ids")
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1]
            guess = words[int(torch.argmax(logits[allowed]))]
            msgs.append({"role": "assistant", "content": guess})
            obs, _, terminated, _, info = env.step(guess)
            path.append(guess)
            if terminated:
                break
        wins += bool(info["success"])
        print(f"secret {secret}: {' -> '.join(path)}  {'ok' if info['success'] else 'miss'}")
    print(f"greedy success {wins}/{args.high - args.low + 1}")


if __name__ == "__main__":
    main()
