"""`clusterenv.collect_chunk`: decode the JSON request, run one chunk, return a small JSON summary;
and, as a task arrives, the note of which worker took its chunks (pipeline/chunks/takers.py)."""

from __future__ import annotations

import logging
import os
from typing import Any

import redis
from celery.signals import task_received

from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.runtime import WorkerRuntime
from clusterenv.pipeline.chunks.takers import RedisChunkTakers
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.task_args import TaskArgsError
from clusterenv.tasks.app import JsonResult, app

log = logging.getLogger(__name__)
_runtime: WorkerRuntime | None = None
_takers_client: redis.Redis | None = None  # the consumer's (a prefork worker's parent process)


def runtime(hostname: str) -> WorkerRuntime:
    """One runtime per worker process, created on its first chunk (after any fork)."""
    global _runtime
    if _runtime is None:
        name = f"{hostname}:{os.getpid()}"
        _runtime = WorkerRuntime(
            connect(app.conf.broker_url), name, app.conf.clusterenv_max_cached_runs
        )
    return _runtime


@task_received.connect
def note_taker(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Note this worker (its registry name) against the chunk ids of a collect_chunk task as the
    task arrives, prefetched ones too: should the worker die, the learner writes them off when
    its heartbeat lapses. Best effort: without the note a lost chunk waits for --lost-after-s."""
    global _takers_client
    if request is None or request.task_name != COLLECT_CHUNK_TASK:
        return
    try:
        req = ChunkRequest.from_json(request.kwargs)
    except TaskArgsError:
        return  # the task itself refuses it, by name
    try:
        if _takers_client is None:
            _takers_client = connect(app.conf.broker_url)
        chunk_ids = range(req.chunk_id, req.chunk_id + req.chunks)
        RedisChunkTakers(_takers_client, RunKeys(req.run_id)).note(chunk_ids, request.hostname)
    except redis.RedisError as exc:
        log.warning("could not note the taker of chunk %d of %s: %s", req.chunk_id, req.run_id, exc)


@app.task(bind=True, name=COLLECT_CHUNK_TASK)
def collect_chunk(self, **request: Any) -> JsonResult:
    req = ChunkRequest.from_json(request)
    return JsonResult(runtime(self.request.hostname or "worker").run_chunk(req))
