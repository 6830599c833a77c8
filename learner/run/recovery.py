"""Broker recovery: a broker that lost the run's state (restarted without persistence) gets the
run's marker, weights and reference states again, and what it held in flight is re-dispatched."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from clusterenv.learner.run.accounting import RunAccounting
from clusterenv.learner.run.evaluation import RemoteEvaluation
from clusterenv.pipeline.chunks.dispatcher import Dispatcher
from clusterenv.pipeline.roles import RunFlags

log = logging.getLogger(__name__)


class BrokerRecovery:
    """Looks at most every `every_s` whether the broker still holds the run's marker, and if not
    restores what the run needs there. The marker, not `weights:latest`: the learner's own next
    publish may re-create that."""

    def __init__(
        self,
        flags: RunFlags,
        dispatcher: Dispatcher,
        evaluation: RemoteEvaluation,
        publish_again: Callable[[], int],
        accounting: RunAccounting,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.flags, self.dispatcher, self.evaluation = flags, dispatcher, evaluation
        self.publish_again, self.accounting = publish_again, accounting
        self.every_s, self.clock = every_s, clock
        self._checked_at = clock()

    def check(self) -> bool:
        """Recover if the broker lost the run (once a second at most); whether it had."""
        now = self.clock()
        if now - self._checked_at < self.every_s:
            return False
        self._checked_at = now
        if not self.flags.lost():
            return False
        self.flags.mark_started()
        lost = self.dispatcher.write_off_in_flight()  # their tasks went with the broker's queue
        self.evaluation.abandon()
        version = self.publish_again()  # with new reference states: the old ones are gone too
        self.accounting.broker_recoveries += 1
        log.warning("the broker lost this run's state (restarted?): published v%d again, "
                    "re-dispatching %d chunks", version, lost)  # fmt: skip
        return True
