"""``rollart train --resume RUN_DIR`` in the driver: the resume point checked before
anything starts (:class:`ResumePoint`), its checkpoint loaded once the workers run
(:func:`restore`, falling back to older complete ones), and a resume that never got to
load one left exactly as it was (:func:`end_unrestored`). What a checkpoint holds and how
it is verified is :mod:`rollart_sdk.control.resume`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart_sdk.errors import RollartError

if TYPE_CHECKING:
    from rollart_sdk.config import RunConfig
    from rollart_sdk.job.build import Job


@dataclass
class ResumePoint:
    """``rollart train --resume RUN_DIR``: the run directory, the checkpoint to load (the
    newest that passed verification) and the control plane's state saved with it
    (control/resume.py); the complete checkpoints older than it (tried in turn should the
    trainer fail to load it) and the newer ones skipped, each with why."""

    run_dir: Path
    checkpoint: Path
    state: dict[str, Any]
    changed: list[str]  # config keys that differ from the run's (all allowed ones)
    older: list[Any] = field(default_factory=list)  # control.checkpoints.Checkpoint
    skipped: list[str] = field(default_factory=list)  # "step-N: why", newest first

    @classmethod
    def prepare(cls, cfg: RunConfig, run_dir: str | Path, steps: int) -> ResumePoint:
        """Check the run directory, its checkpoints and the config, before anything
        starts (and before anything is written)."""
        from rollart_sdk.control import checkpoints
        from rollart_sdk.control.resume import check_config, check_run_dir, find_loadable

        path, _ = check_run_dir(run_dir)
        changed = check_config(cfg, path)
        found = checkpoints.complete(path / "checkpoints")
        skipped: list[str] = []
        picked = find_loadable(found, skipped)
        if picked is None:
            raise RollartError(
                f"--resume {run_dir}: no checkpoint passed verification ("
                + "; ".join(skipped) + "); nothing was changed; start the run again "
                "without --resume")
        ckpt, state = picked
        if state["step"] >= steps:
            raise RollartError(
                f"--resume {run_dir}: {ckpt.name} has {state['step']} steps done, and the run "
                f"stops at {steps}; to train further, raise the step count (e.g. "
                f"train.steps={state['step'] + steps} or --steps {state['step'] + steps})")
        older = found[found.index(ckpt) + 1:]
        return cls(path, ckpt.path, state, changed, older, skipped)

    def announce(self, log: Any) -> None:
        """The console lines of a resumed run's start: the checkpoints skipped, and
        where it continues from."""
        for line in self.skipped:
            log(f"checkpoint {line}: skipped")
        log(f"resuming from {self.checkpoint} ({self.state['step']} steps done)"
            + (f"; changed: {', '.join(self.changed)}" if self.changed else ""))


def newest_checkpoint(root: Path) -> str | None:
    """The newest complete checkpoint under ``root`` (``RUN/checkpoints``): the one
    ``--resume`` would try first."""
    from rollart_sdk.control import checkpoints

    found = checkpoints.complete(root)
    return str(found[0].path) if found else None


async def restore(job: Job) -> None:
    """Load the resume point's checkpoint; when the trainer cannot load it (or its
    version disagrees with its run state), the next older complete checkpoint that passes
    verification, saying why. Only once one is loaded are the metrics lines past it moved
    aside. Raises ResumeFailed when none loads (nothing written)."""
    from rollart_sdk.control.resume import CheckpointUnusable, ResumeFailed, find_loadable

    rp = job.resume
    assert rp is not None
    ckpt, state, older = rp.checkpoint, rp.state, list(rp.older)
    failed: list[str] = []
    while True:
        try:
            await job.pipeline.restore(str(ckpt), state)
            break
        except CheckpointUnusable as exc:
            failed.append(f"{ckpt.name}: {exc.why}")
            nxt = find_loadable(older, failed)
            if nxt is None:
                raise ResumeFailed(
                    f"--resume {rp.run_dir}: no checkpoint could be loaded ("
                    + "; ".join(failed) + "); nothing in the run directory was changed") from exc
            older = older[older.index(nxt[0]) + 1:]
            job.pipeline.say(f"checkpoint {failed[-1]}; trying {nxt[0].name}")
            ckpt, state = nxt[0].path, nxt[1]
    rp.checkpoint, rp.state = ckpt, state
    job.restored = True
    moved = job.run_dir.rollback_metrics(int(state["step"]))
    job.pipeline.say(f"resumed from {ckpt} ({state['step']} steps done)"
                     + (f"; {moved} metrics lines past it moved to metrics.rolledback.jsonl"
                        if moved else ""))


def end_unrestored(job: Job, interrupted: bool, error: Exception | None) -> None:
    """The resume did not get to load a checkpoint: the run directory stays exactly as it
    was (no checkpoint, final_model/, metrics or summary.json written). Raises."""
    from rollart_sdk.control.resume import ResumeFailed

    job.run_dir.close()
    if interrupted:
        raise KeyboardInterrupt
    assert error is not None and job.resume is not None
    if isinstance(error, ResumeFailed):
        raise error
    raise ResumeFailed(f"--resume {job.resume.run_dir}: {type(error).__name__}: {error}"
                       "; nothing in the run directory was changed") from error
