"""PolicyVersions: the one record of which policy version the engines serve and the
trainer holds.

Created before the scheduler and the pipeline and handed to both: the pipeline advances
it (``trainer`` after each train step, ``engine`` after each weight update) and the
scheduler stamps every trajectory it launches with ``serving()`` (the version its first
tokens are sampled from).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PolicyVersions:
    engine: int = 0  # the version every engine serves
    trainer: int = 0  # the version the trainer holds (= train steps done)
    # A deferred weight update (or a failed transfer) keeps the engines a version behind
    # the newest published one, on purpose, until a later suspend point.
    held_back: bool = False

    def serving(self) -> int:
        return self.engine

    def admission_base(self) -> int:
        """The version admission control counts from: the engines' (one more while a
        newer version is held back: deferred, or failed to arrive), the version new
        trajectories are sampled from. The engines follow the trainer at once: an update
        runs as soon as a training step ends, also while a batch still forms
        (``Pipeline._next_batch``), so a batch waiting for a straggler's group gets room as
        soon as the step ends. (Counting from the trainer's version instead let the next
        batch start on the older weights in the moment between the step's end and the
        swap: batches trained two versions after their weights.)"""
        return self.engine + (1 if self.held_back else 0)
