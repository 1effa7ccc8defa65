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
        """The version admission control counts from: the newest trained one (the
        engines', one more while an update is held back or not yet swapped in): the batch
        that version would have sampled must still start, or ``get_batch`` waits for it
        until a straggler ends (an agent episode that runs for minutes stalled the run at
        alpha 1 when this counted the engines' version while an update waited for the
        next suspend point)."""
        return max(self.engine + (1 if self.held_back else 0), self.trainer)
