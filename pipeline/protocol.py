"""The small JSON arguments of Celery tasks, checked on both ends."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Self

from pipeline.sync import DEFAULT_SYNC


class TaskArgs:
    """For dataclass task arguments: `to_json` out; `from_json` refuses unknown fields, then `check`s."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        unknown = set(data) - {f.name for f in fields(cls)}  # type: ignore[arg-type]
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {', '.join(sorted(unknown))}")
        args = cls(**data)
        args.check()
        return args

    def check(self) -> None:
        """Raise ValueError naming what is wrong with these arguments."""


@dataclass(frozen=True)
class ChunkRequest(TaskArgs):
    """One chunk of collection: which run, which env, how many steps, how to act and sync."""

    run_id: str
    chunk_id: int
    env_id: str
    num_envs: int
    steps: int
    seed: int
    epsilon: float
    sync: str = DEFAULT_SYNC
    max_lag_versions: int = 0
    max_lag_s: float = 0.0
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        if self.num_envs < 1 or self.steps < 1:
            raise ValueError(f"num_envs and steps must be >= 1, got {self.num_envs}, {self.steps}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
