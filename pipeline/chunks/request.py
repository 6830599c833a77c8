"""`clusterenv.collect_chunk`: its task name and its JSON arguments, checked on both ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.sync.rules import DEFAULT_SYNC, parse_sync
from clusterenv.pipeline.task_args import TaskArgs, TaskArgsError

COLLECT_CHUNK_TASK = "clusterenv.collect_chunk"
# A task stays short enough that a lost worker costs little (its chunks are written off and replaced).
MAX_CHUNKS_PER_TASK = 64


@dataclass(frozen=True)
class ChunkRequest(TaskArgs):
    """Chunks of collection: which run, which chunk ids, which env, how many steps, how to act
    and sync. The task collects chunk ids `chunk_id` … `chunk_id + chunks - 1` back to back.
    `behaviour` is how the worker acts on the network's outputs (pipeline/behaviour.py): ε-greedy
    on Q-values (DQN) or sampling the categorical policy of logits (PPO; each row then carries its
    behaviour log-prob `logp`)."""

    run_id: str
    chunk_id: int
    env_id: str
    num_envs: int
    steps: int
    seed: int
    behaviour: Behaviour
    sync: str = DEFAULT_SYNC
    max_lag_versions: int = 0
    max_lag_seconds: float = 0.0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    chunks: int = 1
    time_limit_s: float = 0.0  # a chunk running longer is cut off as a hung env (0: no limit)
    # DQN with worker-computed initial priorities (pipeline/chunks/priorities.py): each row gets
    # its |TD error| over this n-step window and discount (0: no priorities sent).
    priority_n_step: int = 0
    priority_gamma: float = 0.0

    def chunk_ids(self) -> range:
        """The ids of the chunks this task collects."""
        return range(self.chunk_id, self.chunk_id + self.chunks)

    def check(self) -> None:
        if self.num_envs < 1 or self.steps < 1:
            raise TaskArgsError(
                f"num_envs and steps must be >= 1, got {self.num_envs}, {self.steps}"
            )
        if not 1 <= self.chunks <= MAX_CHUNKS_PER_TASK:
            raise TaskArgsError(f"chunks must be in [1, {MAX_CHUNKS_PER_TASK}], got {self.chunks}")
        if self.max_lag_versions < 0 or not self.max_lag_seconds >= 0:  # NaN too
            raise TaskArgsError("max_lag_versions and max_lag_seconds must be >= 0")
        if not 0 <= self.time_limit_s < float("inf"):
            raise TaskArgsError(f"time_limit_s must be finite and >= 0, got {self.time_limit_s}")
        if not 0 <= self.priority_n_step <= 255 or not 0.0 <= self.priority_gamma <= 1.0:
            raise TaskArgsError(
                f"priority_n_step must be in [0, 255] and priority_gamma in [0, 1], got "
                f"{self.priority_n_step}, {self.priority_gamma}"
            )
        try:
            parse_sync(self.sync, self.max_lag_versions, self.max_lag_seconds, type(self.behaviour))
        except ValueError as exc:
            raise TaskArgsError(str(exc)) from None
