"""`clusterenv.collect_chunk`: decode the JSON request, run one chunk, return a small JSON summary."""

from __future__ import annotations

import os
from typing import Any

from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.runtime import WorkerRuntime
from clusterenv.pipeline.connect import connect
from clusterenv.tasks.app import JsonResult, app, shutting_down

_runtime: WorkerRuntime | None = None


def runtime(hostname: str) -> WorkerRuntime:
    """One runtime per worker process, created on its first chunk (after any fork)."""
    global _runtime
    if _runtime is None:
        name = f"{hostname}:{os.getpid()}"
        _runtime = WorkerRuntime(connect(app.conf.broker_url), name,
                                 app.conf.clusterenv_max_cached_runs, shutting_down.is_set)  # fmt: skip
    return _runtime


@app.task(bind=True, name=COLLECT_CHUNK_TASK)
def collect_chunk(self, **request: Any) -> JsonResult:
    req = ChunkRequest.from_json(request)
    return JsonResult(runtime(self.request.hostname or "worker").run_chunk(req))
