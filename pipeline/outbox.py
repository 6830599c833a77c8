"""Writes a worker holds back to send with its next read: one round trip where there were two.

A worker's chunk ends with an XADD and the next chunk starts with the sync check's reads. Sent
separately, each waits a full round trip to the broker (on a loaded 2-core host ~0.2 ms apiece,
bench/overhead.py). The stream writer queues its XADD here instead, and the sync check sends it
in front of its own reads; whoever ends a batch of work calls `flush` for what is left.

Writes go first, so a chunk is stored before the stop check that may end the task is read. A
connection error makes redis-py retry the whole pipeline, so a write may land twice; chunk ids
are de-duplicated by the learner (pipeline/connect.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline


class Outbox:
    """Commands queued by `hold`, sent in front of the next `send` or by `flush`."""

    def __init__(self, client: redis.Redis):
        self._pipe = client.pipeline(transaction=False)

    def hold(self, add: Callable[[Pipeline], Any]) -> None:
        """Queue the commands `add` puts on the pipeline; nothing is sent yet."""
        add(self._pipe)

    def send(self, add: Callable[[Pipeline], Any]) -> list[Any]:
        """Send what is held and the commands `add` queues, in one round trip; the replies to
        `add`'s commands only (a held write that fails raises here)."""
        held = len(self._pipe)
        add(self._pipe)
        return self._pipe.execute()[held:]

    def flush(self) -> None:
        """Send what is held, if anything."""
        if len(self._pipe):
            self._pipe.execute()
