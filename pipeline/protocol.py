"""The small JSON arguments of a `collect_chunk` task, checked on both ends."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChunkRequest:
    """One chunk of collection: which run, which env, how many steps, how to act and sync."""

    run_id: str
    chunk_id: int
    env_id: str
    num_envs: int
    steps: int
    seed: int
    epsilon: float
    sync: str = "on-change"
    max_lag_versions: int = 0
    max_lag_s: float = 0.0
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkRequest:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown chunk request fields: {', '.join(sorted(unknown))}")
        req = cls(**data)
        if req.num_envs < 1 or req.steps < 1:
            raise ValueError(f"num_envs and steps must be >= 1, got {req.num_envs}, {req.steps}")
        if not 0.0 <= req.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {req.epsilon}")
        return req
