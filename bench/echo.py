"""A bench-only Celery task, `bench.echo`: the plain task round trip bench/remote_env.py compares with.

It is not in clusterenv.tasks (production workers never carry it): a benchmark starts its workers
with `--include bench.echo` (LocalWorkers' `include`), so the same app, settings and worker
processes that host remote-env shards also answer this task, and the round trip measured is
Celery's own (send_task, a worker runs it, one RPUSH back).
"""

from __future__ import annotations

import redis

from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import PREFIX
from clusterenv.tasks.app import app

ECHO_TASK = "bench.echo"
MODULE = __name__  # what a worker is told to --include

_client: redis.Redis | None = None


def echo_reply(token: str) -> str:
    """The list one echo task pushes its token back to."""
    return f"{PREFIX}:bench:echo:{token}"


@app.task(name=ECHO_TASK, acks_late=False)
def echo(token: str) -> None:
    """Push `token` back to its reply list."""
    global _client
    if _client is None:
        _client = connect(app.conf.broker_url)
    _client.rpush(echo_reply(token), token)
