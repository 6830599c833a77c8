"""One heartbeat loop for everything that announces itself with an expiring key."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Calls `beat` every `every_s` seconds from a daemon thread, until `stop()` or `beat` says False.

    A beat that raises is logged and skipped: the key's TTL, not one failed write, decides
    whether the owner counts as gone.
    """

    def __init__(self, name: str, beat: Callable[[], bool | None], every_s: float):
        super().__init__(name=name, daemon=True)
        self.beat, self.every_s = beat, every_s
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.every_s):
            try:
                if self.beat() is False:
                    return
            except Exception as exc:
                log.warning("%s: beat failed: %s", self.name, exc)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=timeout_s)
