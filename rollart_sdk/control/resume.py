"""Resume: what a checkpoint holds beyond the trainer's state, and reading it back.

A checkpoint folder (``checkpoints/step-N``, :mod:`rollart_sdk.control.checkpoints`) holds
the trainer's own files (model, optimiser, RNG), ``run_state.json``: the control plane's
side of the run at that step (step number, version, the accounting
``launched = trained + dropped`` per task, the scheduler's task-choice RNG and counters,
the wall time so far, and the raw figures of the run summary so far), and
``manifest.json`` (every file's size and checksum). Only a complete folder is published
under its name (written hidden, fsynced, renamed), so a cut save is never resumed from.

``rollart train CONFIG --resume RUN_DIR`` (:mod:`rollart_sdk.cli.train`) checks that the
config is the run's (``check_config``: only ``RESUME_MAY_CHANGE`` may differ), verifies
the newest complete checkpoint against its manifest (falling back to the next newest one
that passes, saying why), opens the run directory for appending, and the pipeline loads
it (``Pipeline.restore``): trainer state, weights pushed to every engine, counters and
RNG. A checkpoint the trainer cannot load is skipped the same way. Trajectories finished
and not trained at the checkpoint (ready groups, a batch handed out but not trained) are
saved in it (``CARRIED_FILE``) and put back into the buffer. Until the load
succeeded nothing in the run directory is changed (metrics lines past the checkpoint are
moved aside only then); a resume that finds no loadable checkpoint writes nothing.
Trajectories that were running at the checkpoint are not in it: they are counted as
dropped, reason ``resumed_in_flight``, so the accounting still holds.
"""

from __future__ import annotations

import json
import os
import pickle
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rollart_sdk import durable
from rollart_sdk.config import RunConfig
from rollart_sdk.control import checkpoints
from rollart_sdk.control.metrics import summary_carry
from rollart_sdk.errors import RollartError

if TYPE_CHECKING:
    from rollart_sdk.control.pipeline import Pipeline

RUN_STATE = "run_state.json"
RUN_STATE_FORMAT = 1
# Finished trajectories not trained at the checkpoint (ready groups, batches handed out
# but not trained): pickled, trained after a resume instead of being lost.
CARRIED_FILE = "carried.pkl"
# Keys a resumed run may change (everything else must equal the run's config.yaml).
RESUME_MAY_CHANGE = ("train.steps", "train.call_timeout_s", "train.checkpoint_every",
                     "train.checkpoint_every_s", "train.keep_checkpoints", "rollout.stall_timeout_s", "ray.address", "ray.num_cpus", "output_dir",
                     "eval", "layout")


def capture_state(p: Pipeline, step: int, version: int | None = None) -> dict[str, Any]:
    """The control plane at the end of step ``step`` (steps done; ``version``: the
    trainer's, default the pipeline's record of it): trained counts are the batches up to
    that step; everything else launched and not dropped is in flight."""
    s, b = p.scheduler, p.buffer
    trained_by_tag = dict(p.trained_by_tag_at.get(step, Counter()))
    carried, counted = p.finished_untrained()
    dropped = Counter(b.dropped)
    tokens_dropped = b.tokens_dropped
    if counted:  # the run's end counted them dropped (run_end): carried instead
        dropped["run_end"] -= counted
        dropped = +dropped
        tokens_dropped -= sum(t.generated_tokens for t in carried)
    return {
        "_carried": pickle.dumps(carried),  # written beside it (CARRIED_FILE)
        "carried": len(carried),
        "carried_by_tag": dict(Counter(t.tag for t in carried)),
        "format": RUN_STATE_FORMAT,
        "step": step,
        "version": p.trainer_version if version is None else version,
        "launched": s.launched,
        "launched_by_tag": dict(s.launched_by_tag),
        "trained": sum(trained_by_tag.values()),
        "trained_by_tag": trained_by_tag,
        "dropped": dict(dropped),
        "tokens_trained": b.tokens_trained,
        "tokens_dropped": tokens_dropped,
        "filtered_groups": b.filtered_groups,  # dynamic sampling's run totals
        "zero_variance_kept": b.zero_variance_kept,
        "retried": s.retried,
        "rng": _jsonable_state(s._rng.getstate()),
        "group_counter": s._group_counter,
        "traj_counter": s._traj_counter,
        "wall_s": p.wall_s(),
        "resumes": p.resumes,
        # The run summary's raw figures up to this step (learning curve per step, spanning,
        # staleness, turns trained) and the turns of every finished trajectory, so a
        # resumed run's summary.json covers the whole run.
        "summary": summary_carry(p, upto=step),
        "finished_turns": {tag: list(v) for tag, v in b.finished_turns.items()},
        "finished_outcomes": {tag: list(v) for tag, v in b.finished_outcomes.items()},
    }


def read_carried(ckpt: str | Path) -> list[Any]:
    """The trajectories checkpoint ``ckpt`` carried ([] for one written before)."""
    f = Path(ckpt) / CARRIED_FILE
    if not f.is_file():
        return []
    out: list[Any] = pickle.loads(f.read_bytes())  # our own file, checked by its manifest
    return out


def apply_state(p: Pipeline, state: dict[str, Any], carried: list[Any] | None = None) -> None:
    """Counters, RNG and step numbering of ``state`` into a freshly built pipeline, and
    the ``carried`` trajectories back into the buffer, ready to be trained."""
    carried = carried or []
    s, b = p.scheduler, p.buffer
    p.first_step = int(state["step"])
    p._reported = p.first_step
    p.wall_offset = float(state["wall_s"])
    p.resumes = int(state.get("resumes", 0)) + 1
    trained_by_tag = Counter({k: int(v) for k, v in state["trained_by_tag"].items()})
    p.trained_by_tag = Counter(trained_by_tag)
    p.trained_by_tag_at = {p.first_step: Counter(trained_by_tag)}
    s.launched = int(state["launched"])
    s.launched_by_tag = Counter({k: int(v) for k, v in state["launched_by_tag"].items()})
    s.retried = int(state.get("retried", 0))
    b.trained = int(state["trained"])
    b.dropped = Counter({k: int(v) for k, v in state["dropped"].items()})
    carried_by_tag = Counter(t.tag for t in carried)
    lost = s.launched - b.trained - sum(b.dropped.values()) - len(carried)
    if lost > 0:  # running (or in an unfinished group) at the checkpoint: not in it
        b.dropped["resumed_in_flight"] += lost
    # Admission control counts a task's live trajectories as launched - dropped: the
    # trained and the carried ones (ready again).
    b.dropped_by_tag = Counter({tag: n - trained_by_tag.get(tag, 0) - carried_by_tag[tag]
                                for tag, n in s.launched_by_tag.items()})
    b.carry_in(carried)
    b.tokens_trained = int(state.get("tokens_trained", 0))
    b.tokens_dropped = int(state.get("tokens_dropped", 0))
    b.filtered_groups = int(state.get("filtered_groups", 0))
    b.zero_variance_kept = int(state.get("zero_variance_kept", 0))
    s._rng.setstate(_tuplify(state["rng"]))
    s._group_counter = int(state["group_counter"])
    s._traj_counter = int(state["traj_counter"])
    # Checkpoints written before these keys existed: the summary covers this session.
    p.carried = dict(state.get("summary", {}))
    b.finished_turns = {tag: [int(n), int(t)] for tag, (n, t) in
                        state.get("finished_turns", {}).items()}
    b.finished_outcomes = {tag: [int(n), float(r), int(j), int(s)] for tag, (n, r, j, s) in
                           state.get("finished_outcomes", {}).items()}
    from rollart_sdk.control.pipeline import StepRecord
    from rollart_sdk.control.records import outcomes

    # Per-step deltas of the first resumed step (rollout/launched_step, turns_finished/)
    # count from the totals restored here, not from 0.
    p.session_start = StepRecord(
        step=p.first_step - 1, version=int(state["version"]), batch=[], get_batch_wait_s=0.0,
        launched=s.launched,
        finished_turns={tag: (n, t) for tag, (n, t) in b.finished_turns.items()},
        finished_outcomes=outcomes(b.finished_outcomes))


def newest_resumable(run_dir: Path) -> Path | None:
    """The complete checkpoint of ``run_dir`` with the most steps (newest on a tie),
    unverified (:func:`find_loadable` verifies)."""
    found = checkpoints.complete(Path(run_dir) / "checkpoints")
    return found[0].path if found else None


def read_state(ckpt: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((ckpt / RUN_STATE).read_text())
    if state.get("format") != RUN_STATE_FORMAT:
        raise RollartError(f"{ckpt / RUN_STATE}: format {state.get('format')!r} is not "
                           f"supported (this version reads {RUN_STATE_FORMAT})")
    return state


def find_loadable(found: list[checkpoints.Checkpoint], skipped: list[str]
                  ) -> tuple[checkpoints.Checkpoint, dict[str, Any]] | None:
    """The first of ``found`` that passes :func:`checkpoints.verify` with a readable run
    state, and that state; each one that does not is appended to ``skipped`` as
    ``"step-N: why"``. Reads nothing but the checkpoints."""
    for c in found:
        problem = checkpoints.verify(c)
        if problem is None:
            try:
                return c, read_state(c.path)
            except (RollartError, OSError, ValueError) as exc:
                problem = str(exc)
        skipped.append(f"{c.name}: {problem}")
    return None


def check_run_dir(run_dir: str | Path) -> tuple[Path, Path]:
    """``(run dir, newest complete checkpoint)``, or a RollartError saying what is missing
    (unverified: :meth:`rollart_sdk.job.ResumePoint.prepare` verifies)."""
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise RollartError(f"--resume {run_dir}: not a run directory (no config.yaml); give "
                           "the folder `rollart train` printed as 'run directory: ...'")
    ckpt = newest_resumable(path)
    if ckpt is None:
        raise RollartError(
            f"--resume {run_dir}: no complete checkpoint in {path / 'checkpoints'} (a "
            f"complete one is a step-N folder with {checkpoints.MANIFEST}); the run stopped "
            "before its first checkpoint: start it again without --resume (periodic "
            "checkpoints: train.checkpoint_every_s, train.checkpoint_every)")
    return path, ckpt


def check_config(cfg: RunConfig, run_dir: Path) -> list[str]:
    """Keys where ``cfg`` differs from the run's ``config.yaml`` that may not change.
    Returns the allowed differences (for the log)."""
    old = _flat(yaml.safe_load((run_dir / "config.yaml").read_text()))
    new = _flat(cfg.model_dump(mode="json"))
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))
    allowed = [k for k in changed if k.startswith(RESUME_MAY_CHANGE)]
    refused = [k for k in changed if k not in allowed]
    if refused:
        shown = "; ".join(f"{k}: run has {_show(old.get(k, _MISSING))}, now "
                          f"{_show(new.get(k, _MISSING))}" for k in refused[:5])
        more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
        raise RollartError(
            f"--resume {run_dir}: the config differs from the run's config.yaml at {shown}{more}. "
            f"A resumed run keeps its config; only {', '.join(RESUME_MAY_CHANGE)} may change "
            f"(pass {run_dir / 'config.yaml'} as CONFIG to resume with it unchanged)")
    return allowed


def rollback_metrics(run_dir: Path, step: int) -> int:
    """Lines of ``metrics.jsonl`` past ``step`` (trained after the checkpoint, so trained
    again now) move to ``metrics.rolledback.jsonl``, and so does a line that is not JSON
    (torn by a kill or a full disk mid-write); returns how many moved."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    keep: list[str] = []
    moved: list[str] = []
    for line in path.read_text().splitlines():
        try:
            past = int(json.loads(line).get("step", 0)) > step
        except (ValueError, AttributeError, TypeError):
            past = True  # torn: not a metrics line any more
        (moved if past else keep).append(line)
    if moved:
        # The moved lines are appended first: a crash between the two writes leaves them
        # in both files, never in neither; metrics.jsonl is replaced atomically.
        with open(run_dir / "metrics.rolledback.jsonl", "a") as f:
            f.write("".join(x + "\n" for x in moved))
            f.flush()
            os.fsync(f.fileno())
        durable.write_text(path, "".join(x + "\n" for x in keep))
    return len(moved)


_MISSING = object()


def _show(v: Any) -> str:
    return "(absent)" if v is _MISSING else repr(v)[:80]


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        for i, v in enumerate(data):
            out.update(_flat(v, f"{prefix}.{i}"))
    else:
        out[prefix] = data
    return out


def _jsonable_state(x: Any) -> Any:
    return [_jsonable_state(v) for v in x] if isinstance(x, tuple | list) else x


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


class CheckpointUnusable(RollartError):
    """The trainer could not load checkpoint ``path`` (``why``); an older one may do."""

    def __init__(self, path: str | Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = Path(path)
        self.why = why


class ResumeFailed(RollartError):
    """``--resume`` found no checkpoint it could load (or the engines could not take its
    weights); nothing in the run directory was changed."""
