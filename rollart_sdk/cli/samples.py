"""``rollart samples RUN_DIR``: print the trajectories a run kept in samples.jsonl, turn by
turn, as the model saw them (control/samples.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rollart_sdk.control.samples import read_samples
from rollart_sdk.errors import RollartError

RULE = "-" * 72


def select(rows: list[dict[str, Any]], task: str | None = None, step: int | None = None,
           order: str | None = None, dropped: bool | None = None,
           limit: int | None = None) -> list[dict[str, Any]]:
    """The samples of ``task`` and ``step`` (None: all); ``order`` ``worst``/``best``
    sorts by reward (dropped ones, which have none, last); ``dropped`` True / False keeps
    only dropped / trained ones; ``limit`` keeps the first so many."""
    out = [r for r in rows if (task is None or r.get("tag") == task)
           and (step is None or r.get("step") == step)
           and (dropped is None or (r.get("outcome") == "dropped") == dropped)]
    if order is not None:
        scored = [r for r in out if r.get("reward") is not None]
        rest = [r for r in out if r.get("reward") is None]
        scored.sort(key=lambda r: (float(r["reward"]), r.get("step", 0)),
                    reverse=order == "best")
        out = scored + rest
    return out[:limit] if limit else out


def render(row: dict[str, Any], ids: bool = False) -> str:
    """One sample as text: a header (task, step, outcome, reward, versions, staleness),
    the reward details and env info, then each turn's observation and action exactly as
    decoded, between marked turn boundaries."""
    head = [f"step {row.get('step')}  task {row.get('tag')}  {row.get('trajectory')} "
            f"(group {row.get('group')})", "  " + _outcome(row)]
    vers = row.get("versions") or []
    policy = (f"  policy version{'s' if len(vers) > 1 else ''} "
              f"{', '.join(str(v) for v in vers) or 'none'} (started at "
              f"{row.get('start_version')})")
    if row.get("staleness") is not None:
        policy += (f", staleness {row['staleness']}, trained at version "
                   f"{int(row.get('start_version') or 0) + int(row.get('trainer_staleness') or 0)}")
    policy += f", temperature {row.get('temperature')}"
    if row.get("constrained"):
        policy += ", constrained actions"
    head.append(policy)
    if row.get("reward_details"):
        head.append(f"  reward details: {json.dumps(row['reward_details'])}")
    if row.get("info"):
        head.append(f"  info: {json.dumps(row['info'])}")
    return "\n".join([RULE, *head, *_turns(row, ids)])


def _turns(row: dict[str, Any], ids: bool) -> list[str]:
    earlier = row.get("earlier_segments") or []
    lines = []
    for k, seg in enumerate(earlier):
        lines.append(f"=== segment {k + 1} of {len(earlier) + 1} (trained as its own sample) ===")
        lines += _turn_lines(seg, ids)
    if earlier:
        lines.append(f"=== segment {len(earlier) + 1} of {len(earlier) + 1} (the last) ===")
    lines += _turn_lines(row.get("turns", []), ids)
    if not row.get("turns"):
        lines.append("(no turns: it ended before the first action)")
    return lines


def _turn_lines(turns: list[dict[str, Any]], ids: bool) -> list[str]:
    lines = []
    for turn in turns:
        n = turn.get("turn")
        lines.append(f"--- turn {n}: observation ({len(turn.get('observation_ids', []))} "
                     "tokens) ---")
        lines.append(turn.get("observation", ""))
        if ids:
            lines.append(f"    ids {turn.get('observation_ids')}")
        if not turn.get("action_ids"):  # a turn another sample trains (gateway branches)
            lines.append(f"--- turn {n}: no action: context here, trained in another "
                         "sample ---")
            continue
        meta = [f"{len(turn.get('action_ids', []))} tokens",
                f"version {','.join(str(v) for v in turn.get('versions', []))}",
                f"env reward {_num(turn.get('env_reward'))}"]
        if turn.get("invalid_action"):
            meta.append("INVALID action")
        lines.append(f"--- turn {n}: action ({', '.join(meta)}) ---")
        lines.append(turn.get("action", ""))
        if ids:
            lines.append(f"    ids {turn.get('action_ids')}")
    return lines


def _outcome(row: dict[str, Any]) -> str:
    if row.get("outcome") == "dropped":
        return f"DROPPED: {row.get('dropped')}"
    bits = [f"reward {_num(row.get('reward'))}"]
    if row.get("success") is not None:
        bits.append(f"success {'yes' if row['success'] else 'no'}")
    bits.append(f"env return {_num(row.get('env_return'))}")
    end = "terminated" if row.get("terminated") else "truncated" if row.get("truncated") else ""
    return ", ".join(bits + ([end] if end else []))


def _num(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.3g}"


def cmd_samples(args: argparse.Namespace) -> int:
    run = Path(args.run_dir)
    path = run / "samples.jsonl" if run.is_dir() else run
    if not path.exists():
        raise RollartError(
            f"{path}: no samples (runs write samples.jsonl when train.samples_per_task > 0; "
            "give a run directory of `rollart train`)")
    rows = read_samples(path)
    order = "worst" if args.worst else "best" if args.best else None
    dropped = True if args.dropped else False if args.trained else None
    picked = select(rows, args.task, args.step, order, dropped, args.limit)
    if not picked:
        tasks = sorted({str(r.get("tag")) for r in rows})
        steps = sorted({int(r.get("step", 0)) for r in rows})
        span = f"{steps[0]}-{steps[-1]}" if steps else "none"
        raise RollartError(
            f"{path}: no sample matches (tasks: {', '.join(tasks) or 'none'}; steps "
            f"written: {span}, not every step when the run was long: see docs/quickstart.md)")
    for row in picked:
        print(render(row, ids=args.ids))
    print(RULE)
    print(f"{len(picked)} of {len(rows)} samples in {path}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("samples", help="print the trajectories a run kept (samples.jsonl), "
                       "turn by turn as the model saw them")
    p.add_argument("run_dir", help="a run directory (or its samples.jsonl)")
    p.add_argument("--task", help="only this task (tag)")
    p.add_argument("--step", type=int, help="only this step (1 = the first)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--worst", action="store_true", help="lowest reward first")
    which.add_argument("--best", action="store_true", help="highest reward first")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--dropped", action="store_true", help="only dropped trajectories")
    kind.add_argument("--trained", action="store_true", help="only trained trajectories")
    p.add_argument("-n", "--limit", type=int, default=None, help="print at most N")
    p.add_argument("--ids", action="store_true", help="also print the token ids")
    p.set_defaults(func=cmd_samples)
