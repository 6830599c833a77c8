"""`clusterenv.evaluate`: greedy episodes of one weight version, the returns sent to the learner."""

from __future__ import annotations

from typing import Any

from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.evaluation.request import EVALUATE_TASK, EvalRequest
from clusterenv.pipeline.evaluation.runner import EvalRunner
from clusterenv.tasks.app import JsonResult, app

_runner: EvalRunner | None = None


@app.task(bind=True, name=EVALUATE_TASK)
def evaluate(self, **request: Any) -> JsonResult:
    global _runner
    if _runner is None:  # one per worker process, created after any fork
        _runner = EvalRunner(connect(app.conf.broker_url), self.request.hostname or "worker")
    return JsonResult(_runner.run(EvalRequest.from_json(request)))
