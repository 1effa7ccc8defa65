"""The run directory's files are strict JSON: a metric that is no number (NaN: a mean over
no sample; inf) is written as null, so jq, JavaScript and every other JSON reader parse
metrics.jsonl, events.jsonl and summary.json."""

from __future__ import annotations

import json
import math

import torch

from rollart_sdk.config import load_config
from rollart_sdk.control.run_dir import RunDir


def _strict(line: str):
    def bad(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=bad)


def test_non_finite_metrics_are_written_as_null(tmp_path):
    cfg, _ = load_config(data={
        "name": "json", "model": {"tiny": {}},
        "tasks": [{"tag": "FrozenLake", "env": {"name": "frozenlake"}}],
        "output_dir": str(tmp_path)})
    rd = RunDir(tmp_path, cfg)
    rd.log_metrics({"step": 1, "train/entropy": float("nan"), "train/grad_norm": float("inf"),
                    "train/loss": -0.25, "staleness/hist": {"0": 3, "1": 5},
                    "tensor": torch.tensor(float("nan")), "ok": torch.tensor(2.5),
                    "list": [1.0, float("-inf")]})
    rd.log_event({"span": "x", "t0": 1.0, "t1": float("nan")})
    rd.write_json("summary.json", {"waste": float("nan"), "n": 3})
    rd.close()
    (line,) = (rd.path / "metrics.jsonl").read_text().splitlines()
    m = _strict(line)
    assert m["train/entropy"] is None and m["train/grad_norm"] is None
    assert m["train/loss"] == -0.25 and m["staleness/hist"] == {"0": 3, "1": 5}
    assert m["tensor"] is None and m["ok"] == 2.5 and m["list"] == [1.0, None]
    ev = [_strict(x) for x in (rd.path / "events.jsonl").read_text().splitlines()]
    assert ev[-1]["t1"] is None and math.isclose(ev[-1]["t0"], 1.0)
    assert _strict((rd.path / "summary.json").read_text()) == {"waste": None, "n": 3}


def test_a_span_line_is_what_json_dumps_writes_and_anything_else_goes_the_generic_way():
    """The timeline's span events take a short path (every turn writes two or three);
    each line must be byte for byte what ``json.dumps`` writes, and an event of any other
    shape or with values the short path does not know must still be written right."""
    from rollart_sdk.control.run_dir import dumps, span_line

    spans = [
        {"trajectory": "FrozenLake-g1-1", "tag": "FrozenLake", "span": "generate",
         "worker": "engine-0", "t0": 1796539113.5939775, "t1": 1796539113.6253502},
        {"trajectory": None, "tag": 'a "quoted" tag\\', "span": "env_step",
         "worker": "env-thread", "t0": 0.1, "t1": 1e-7},
        {"trajectory": "t\n1", "tag": "Wörter ✓", "span": "reward", "worker": "llm-proxy",
         "t0": -0.0, "t1": 12345678901234.5},
    ]
    for e in spans:
        line = span_line(e)
        assert line == json.dumps(e) + "\n" and json.loads(line) == e
    others = [
        {"span": "x", "t0": 1.0, "t1": float("nan")},  # not finite: null, generic path
        {"trajectory": "t", "tag": "A", "span": "s", "worker": "w", "t0": 1, "t1": 2.0},
        {"trajectory": "t", "tag": "A", "span": "s", "worker": "w", "t0": 1.0,
         "t1": float("inf")},
        {"tag": "A", "trajectory": "t", "span": "s", "worker": "w", "t0": 1.0, "t1": 2.0},
        {"trajectory": None, "tag": "A", "span": "env_close_failed", "worker": "w",
         "error": "boom"},
        {"trajectory": 7, "tag": "A", "span": "s", "worker": "w", "t0": 1.0, "t1": 2.0},
    ]
    for e in others:
        assert span_line(e) is None
        _strict(dumps(e))
