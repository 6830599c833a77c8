"""`clusterenv.evaluate`: its task name and its JSON arguments, checked on both ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusterenv.pipeline.task_args import TaskArgs, TaskArgsError

EVALUATE_TASK = "clusterenv.evaluate"


@dataclass(frozen=True)
class EvalRequest(TaskArgs):
    """One part of one greedy evaluation: `len(seeds)` episodes of weight version `version`."""

    run_id: str
    eval_id: int
    part: int
    version: int
    env_id: str
    seeds: list[int]
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    time_limit_s: float = 0.0  # a part running longer is cut off as a hung env (0: no limit)

    def check(self) -> None:
        if not self.seeds:
            raise TaskArgsError("EvalRequest.seeds must not be empty")
        if self.version < 0 or self.eval_id < 0 or self.part < 0:
            raise TaskArgsError("EvalRequest version, eval_id and part must be >= 0")
        if not 0 <= self.time_limit_s < float("inf"):
            raise TaskArgsError(f"time_limit_s must be finite and >= 0, got {self.time_limit_s}")
