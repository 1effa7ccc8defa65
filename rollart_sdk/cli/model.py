"""``rollart model``: prepare model checkpoints (GGUF conversion, a tiny random model)."""

from __future__ import annotations

import argparse

from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.models import build_tiny_checkpoint, convert_gguf


def _cmd_convert(args: argparse.Namespace) -> int:
    src = args.src
    if src.startswith("package:"):
        src = str(ModelConfig(gguf=src).gguf_path())
    out = convert_gguf(src, args.out)
    print(f"converted {args.src} -> {out}")
    return 0


def _cmd_tiny(args: argparse.Namespace) -> int:
    tiny = TinyModelConfig(
        hidden_size=args.hidden_size, num_layers=args.num_layers, num_heads=args.num_heads,
        intermediate_size=args.intermediate_size, seed=args.seed,
    )
    out = build_tiny_checkpoint(tiny, args.out, args.extra_token)
    print(f"tiny model written to {out}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``rollart model convert-gguf SRC OUT`` and ``rollart model tiny OUT``."""
    p = subparsers.add_parser("model", help="prepare model checkpoints (GGUF conversion, tiny)")
    sub = p.add_subparsers(dest="model_command", required=True)
    c = sub.add_parser("convert-gguf", help="dequantise a GGUF file into an fp32 checkpoint")
    c.add_argument("src", help="GGUF file, or package:<pkg>/<file>")
    c.add_argument("out", help="output folder")
    c.set_defaults(func=_cmd_convert)
    t = sub.add_parser("tiny", help="build a small random Llama model with a char tokenizer")
    t.add_argument("out", help="output folder")
    t.add_argument("--extra-token", action="append", default=[], metavar="T",
                   help="a string to add as one token (repeatable), e.g. an action word")
    t.add_argument("--hidden-size", type=int, default=64)
    t.add_argument("--num-layers", type=int, default=2)
    t.add_argument("--num-heads", type=int, default=4)
    t.add_argument("--intermediate-size", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=_cmd_tiny)
