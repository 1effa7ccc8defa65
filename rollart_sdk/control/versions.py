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

    def serving(self) -> int:
        return self.engine
