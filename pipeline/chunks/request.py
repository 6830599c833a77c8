"""`clusterenv.collect_chunk`: its task name and its JSON arguments, checked on both ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusterenv.pipeline.policy import POLICY_KINDS
from clusterenv.pipeline.sync.rules import DEFAULT_SYNC, parse_sync
from clusterenv.pipeline.task_args import TaskArgs, TaskArgsError

COLLECT_CHUNK_TASK = "clusterenv.collect_chunk"
# A task stays short enough that a lost worker costs little (its chunks are written off and replaced).
MAX_CHUNKS_PER_TASK = 64


@dataclass(frozen=True)
class ChunkRequest(TaskArgs):
    """Chunks of collection: which run, which chunk ids, which env, how many steps, how to act
    and sync. The task collects chunk ids `chunk_id` … `chunk_id + chunks - 1` back to back.
    `policy` is how the worker acts on the network's outputs: `epsilon_greedy` on Q-values (DQN;
    `epsilon` applies) or `categorical` sampling from logits (PPO; each row then carries its
    behaviour log-prob `logp`)."""

    run_id: str
    chunk_id: int
    env_id: str
    num_envs: int
    steps: int
    seed: int
    epsilon: float
    sync: str = DEFAULT_SYNC
    max_lag_versions: int = 0
    max_lag_seconds: float = 0.0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    chunks: int = 1
    policy: str = "epsilon_greedy"

    def check(self) -> None:
        if self.num_envs < 1 or self.steps < 1:
            raise TaskArgsError(
                f"num_envs and steps must be >= 1, got {self.num_envs}, {self.steps}"
            )
        if not 1 <= self.chunks <= MAX_CHUNKS_PER_TASK:
            raise TaskArgsError(f"chunks must be in [1, {MAX_CHUNKS_PER_TASK}], got {self.chunks}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise TaskArgsError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if self.max_lag_versions < 0 or not self.max_lag_seconds >= 0:  # NaN too
            raise TaskArgsError("max_lag_versions and max_lag_seconds must be >= 0")
        if self.policy not in POLICY_KINDS:
            raise TaskArgsError(
                f"policy must be one of {', '.join(POLICY_KINDS)}, got {self.policy!r}"
            )
        try:
            parse_sync(self.sync, self.max_lag_versions, self.max_lag_seconds, self.policy)
        except ValueError as exc:
            raise TaskArgsError(str(exc)) from None
