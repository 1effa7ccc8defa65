"""Samples of every run: a few whole trajectories per task and step, as the model saw
them, in ``samples.jsonl`` of the run directory (``rollart samples RUN`` prints them).

Each line is one trajectory: its task, step and outcome (trained, or dropped with the
reason), the reward with the reward backend's ``details``, the env's last ``info``, the
policy versions its tokens came from and its staleness, and every turn as the exact token
ids the engine was given and produced, decoded with the special tokens kept (the chat
template's turn markers are part of what the model read): ``observation`` is what came
before the turn's action (the first prompt, then the end of the previous action's turn
and the next observation), ``action`` what the engine sampled. Concatenated in order, the
turns' ids are the context of the trajectory's last generation, token for token.

Per step and task, ``train.samples_per_task`` trained trajectories (spread over the
batch's rewards: the lowest and the highest first) and up to as many dropped since the
previous step (a failure's reason before an abort). Bounded on disk: the file stays under
``train.samples_max_mb``; past the share of the budget the steps so far used, only every
k-th step is written (the run's last steps still get theirs), and a ``truncated`` line
ends it when the budget is spent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart_sdk.control.records import staleness as paper_staleness
from rollart_sdk.control.run_dir import dumps

if TYPE_CHECKING:
    from rollart_sdk.control.pipeline import StepRecord
    from rollart_sdk.types import Trajectory, Turn

MAX_INFO_CHARS = 4000  # an env info (or reward details) longer than this is cut


class SampleLog:
    """Writes ``samples.jsonl``. ``finished`` sees every finished trajectory (a reader
    of the run's ``RolloutEvents``: dropped ones are kept for the next step's lines), ``step``
    every reported step (its trained batch). ``decoders[tag]`` turns ids into text."""

    def __init__(self, path: str | Path, decoders: dict[str, Any], per_task: int = 2,
                 max_bytes: int = 100 * 2**20, steps: int | None = None) -> None:
        self.path = Path(path)
        self.decoders = decoders
        self.per_task = per_task
        self.max_bytes = max_bytes
        self.steps = steps
        # Each step's lines are appended and the file closed again: nothing to close at the
        # run's end, and a crash loses at most the step being written.
        self.enabled = per_task > 0
        self.bytes = self.path.stat().st_size if self.path.exists() else 0
        self.steps_written = 0
        self.lines = 0
        self.truncated = False
        self.error: str | None = None
        self._next_step = 0  # the first step (0-based) that may be written
        self._dropped: dict[str, list[Trajectory]] = {}
        self.last: list[dict[str, Any]] = []  # the rows the last step wrote (metric sinks)

    # ------------------------------------------------------------------ inputs
    def finished(self, traj: Trajectory) -> None:
        """Keep a few dropped trajectories per task for the next step's lines; one that
        failed (env, reward, generation) is kept before one that was aborted."""
        if not self.enabled or traj.dropped is None or traj.dropped.endswith("run_end"):
            return
        kept = self._dropped.setdefault(traj.tag, [])
        if len(kept) < self.per_task:
            kept.append(traj)
            return
        if not traj.dropped.startswith("aborted:"):
            for i, old in enumerate(kept):
                if (old.dropped or "").startswith("aborted:"):
                    kept[i] = traj
                    return

    def step(self, rec: StepRecord) -> int:
        """Write step ``rec``'s samples when the step is due; returns the lines written.
        A failure (a tokenizer that cannot decode, a full disk) is kept in ``error`` and
        turns the log off: samples never stop a run."""
        try:
            return self._step(rec)
        except Exception as exc:  # noqa: BLE001 - recorded; training goes on
            self.error = f"{type(exc).__name__}: {exc}"[:1000]
            self.enabled = False
            return 0

    def _step(self, rec: StepRecord) -> int:
        dropped, self._dropped = self._dropped, {}
        self.last = []
        if not self.enabled or self.truncated or rec.step < self._next_step:
            return 0
        rows = []
        by_tag: dict[str, list[Trajectory]] = {}
        for t in rec.batch:
            by_tag.setdefault(t.tag, []).append(t)
        for tag in sorted(set(by_tag) | set(dropped)):
            for t in spread(by_tag.get(tag, []), self.per_task):
                rows.append(self.record(t, rec.step + 1, rec))
            for t in dropped.get(tag, []):
                rows.append(self.record(t, rec.step + 1, None))
        lines = [dumps(row) for row in rows]
        size = sum(len(line.encode()) + 1 for line in lines)
        if self.bytes + size > self.max_bytes:
            self.truncated = True
            with open(self.path, "a") as f:
                f.write(json.dumps({"truncated": True, "step": rec.step + 1,
                                    "max_bytes": self.max_bytes}) + "\n")
            return 0
        with open(self.path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        self.bytes += size
        self.last = rows
        self.lines += len(lines)
        self.steps_written += 1
        self._next_step = rec.step + self._stride(rec.step, size)
        return len(lines)

    def _stride(self, step: int, size: int) -> int:
        """Steps until the next written one: 1 while the rest of the run fits the budget
        at this step's size, else as many as make it fit."""
        if self.steps is None:
            return 1
        left_steps = self.steps - step - 1
        left_bytes = 0.9 * (self.max_bytes - self.bytes)  # a margin: steps differ in size
        if left_steps <= 0 or size * left_steps <= left_bytes:
            return 1
        if left_bytes <= size:
            return max(1, left_steps)  # room for one more: the run's last step
        return max(1, math.ceil(size * left_steps / left_bytes))

    # ------------------------------------------------------------------ one line
    def record(self, t: Trajectory, step: int, rec: StepRecord | None) -> dict[str, Any]:
        """One trajectory as a JSON-ready dict (``rec`` None: a dropped one)."""
        decode = self._decoder(t.tag)
        info = {k: v for k, v in t.info.items() if k != "reward_details"}

        def rows(turns: list[Turn]) -> list[dict[str, Any]]:
            out = []
            for i, turn in enumerate(turns):
                row: dict[str, Any] = {
                    "turn": i + 1,
                    "observation": decode(turn.obs_ids),
                    "action": decode(turn.action_ids),
                    "observation_ids": list(turn.obs_ids),
                    "action_ids": list(turn.action_ids),
                    "versions": sorted(set(turn.versions)),
                    "env_reward": turn.env_reward,
                }
                if turn.invalid_action is not None:
                    row["invalid_action"] = turn.invalid_action
                out.append(row)
            return out

        out: dict[str, Any] = {
            "step": step,
            "tag": t.tag,
            "trajectory": t.trajectory_id,
            "group": t.group_id,
            "outcome": "trained" if rec is not None else "dropped",
            "dropped": t.dropped,
            "reward": t.reward,
            "reward_details": _bounded(t.info.get("reward_details")),
            "env_return": t.env_return,
            "success": t.info.get("success"),
            "terminated": t.terminated,
            "truncated": t.truncated,
            "start_version": t.start_version,
            "versions": sorted(t.versions),
            "temperature": t.temperature,
            "constrained": t.allowed_token_ids is not None,
            "engine": t.engine,
            "info": _bounded(info),
            "turns": rows(t.turns),
        }
        if t.earlier_segments:  # an agent episode's earlier segments, each its own sample
            out["earlier_segments"] = [rows(seg) for seg in t.earlier_segments]
        if rec is not None:
            # The paper's staleness (the engines' version when the batch's wait began minus
            # the start version) and the trainer's (the version it was trained at).
            out["staleness"] = paper_staleness(rec, t)
            out["trainer_staleness"] = rec.version - t.start_version
        return out

    def _decoder(self, tag: str) -> Any:
        fmt = self.decoders.get(tag)
        tok = getattr(fmt, "tok", fmt)
        if tok is None:
            return lambda ids: ""

        def decode(ids: Sequence[int]) -> str:
            try:  # special tokens kept: the template's markers are what the model read
                return str(tok.decode(list(ids), skip_special_tokens=False))
            except TypeError:
                return str(tok.decode(list(ids)))

        return decode


def spread(trajs: Sequence[Trajectory], k: int) -> list[Trajectory]:
    """``k`` of ``trajs`` spread over their rewards: sorted by reward (then id), the
    lowest, the highest and evenly between (one: the median)."""
    if k <= 0 or not trajs:
        return []
    order = sorted(trajs, key=lambda t: (t.reward if t.reward is not None else -math.inf,
                                         t.trajectory_id))
    n = len(order)
    if k >= n:
        return order
    if k == 1:
        return [order[n // 2]]
    picks = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
    return [order[i] for i in picks]


def _bounded(obj: Any) -> Any:
    """``obj`` when its JSON is at most ``MAX_INFO_CHARS``, else its JSON text cut."""
    if obj is None:
        return None
    text = dumps(obj)
    if len(text) <= MAX_INFO_CHARS:
        return json.loads(text)
    return {"_truncated": text[: MAX_INFO_CHARS - 3] + "..."}


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """The samples of a run directory (or a samples.jsonl), its ``truncated`` line left
    out; a line cut short by a crash is skipped."""
    p = Path(path)
    if p.is_dir():
        p = p / "samples.jsonl"
    out = []
    with open(p) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "tag" in row:
                out.append(row)
    return out


def sample_log(cfg: Any, run_dir: str | Path, tasks: dict[str, Any], chat: Any,
               steps: int | None = None) -> SampleLog:
    """The run's sample log (``train.samples_per_task``, ``train.samples_max_mb``), each
    task (``tasks``: tag -> TaskRuntime) decoded by its own prompt format's tokenizer, else
    by ``chat``; ``steps``: the run's length, if known (else set before the first step)."""
    decoders = {tag: (rt.prompt_format or chat) for tag, rt in tasks.items()}
    t = cfg.train
    return SampleLog(Path(run_dir) / "samples.jsonl", decoders, t.samples_per_task,
                     int(t.samples_max_mb * 2**20), steps)
