"""The one run configuration: every hyperparameter and pipeline setting, each with its help text.

The `clusterenv train` flags are derived from these fields (see pipeline/cli.py); a run directory
stores it as config.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pipeline.sync import DEFAULT_SYNC, SYNC_HELP


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    # --- what to train -------------------------------------------------------------------------
    env: str = _f("CartPole-v1", "Gymnasium env id (discrete actions, Box observations)")
    env_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "JSON object of keyword arguments for gymnasium.make, e.g. '{\"g\": 9.8}'"
        },
    )
    seed: int = _f(1, "seed for the learner, the workers' envs and exploration")
    total_steps: int = _f(100_000, "env-step budget; the run stops when it is spent")
    target_return: float | None = _f(
        None, "stop once the greedy eval mean reaches this (default: the env's reward_threshold)"
    )
    # --- where it runs -------------------------------------------------------------------------
    redis_url: str | None = _f(
        None, "Redis broker shared with the workers; omitted: start an embedded server"
    )
    workers: int | None = _f(
        None,
        "local worker processes to start (default: one per core without --redis-url, 0 with it)",
    )
    envs_per_worker: int = _f(8, "vectorized envs each worker process steps")
    chunk_steps: int = _f(32, "steps per env in one chunk (a chunk has envs_per_worker × this)")
    sync: str = _f(DEFAULT_SYNC, f"weight sync rule: {SYNC_HELP}")
    max_lag_versions: int = _f(0, "aps guard: fetch when this many versions behind (0: off)")
    max_lag_seconds: float = _f(0.0, "aps guard: fetch when the held policy is this old (0: off)")
    reference_size: int = _f(256, "reference states the probes are computed on")
    reference_every: int = _f(16, "published versions between refreshes of the reference states")
    run_dir: str = _f("runs", "parent folder of the run directory")
    # --- Double DQN (RL-Zoo CartPole settings) -------------------------------------------------
    lr: float = _f(2.3e-3, "Adam learning rate")
    batch_size: int = _f(64, "minibatch size")
    buffer_size: int = _f(100_000, "replay capacity in transitions")
    learning_starts: int = _f(1_000, "transitions in replay before the first update")
    gamma: float = _f(0.99, "discount")
    hidden: str = _f("256,256", "hidden layer sizes of the Q-network, comma-separated")
    samples_per_insert: float = _f(
        32.0, "sampled transitions per inserted one (128 updates × 64 per 256 env steps = 32)"
    )
    target_update_every: int = _f(128, "gradient steps between target-network copies")
    publish_every: int = _f(128, "gradient steps between published weight versions")
    max_grad_norm: float = _f(10.0, "gradient clipping norm")
    eps_start: float = _f(1.0, "initial exploration epsilon")
    eps_end: float = _f(0.04, "final exploration epsilon")
    eps_decay_steps: int = _f(16_000, "env steps over which epsilon decays linearly")
    # --- evaluation and output -----------------------------------------------------------------
    eval_every: int = _f(2_000, "env steps between greedy evaluations")
    eval_episodes: int = _f(10, "episodes per greedy evaluation (their mean is compared to target)")
    # One thread: with two, torch's intra-op threads spin against the workers and any other
    # process on a small machine; a contended learner was measured ~20× slower per update.
    torch_threads: int = _f(1, "torch intra-op threads for the learner")

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        positive = (
            "total_steps", "envs_per_worker", "chunk_steps", "batch_size", "buffer_size",
            "target_update_every", "publish_every", "eval_every", "eval_episodes",
            "reference_size", "reference_every",
        )  # fmt: skip
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}"
                )
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {self.workers}")
        if self.learning_starts < self.batch_size:
            raise ValueError("--learning-starts must be at least --batch-size")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"--gamma must be in (0, 1], got {self.gamma}")
        if self.lr <= 0 or self.samples_per_insert <= 0:
            raise ValueError("--lr and --samples-per-insert must be positive")
        if not (0.0 <= self.eps_end <= self.eps_start <= 1.0):
            raise ValueError("need 0 <= --eps-end <= --eps-start <= 1")
        if self.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1, got {self.torch_threads}")
        if self.max_lag_versions < 0 or self.max_lag_seconds < 0:
            raise ValueError("--max-lag-versions and --max-lag-seconds must be >= 0")
        self.hidden_sizes()  # raises on a bad list
        from pipeline.sync import parse_sync

        parse_sync(self.sync)

    def hidden_sizes(self) -> list[int]:
        try:
            sizes = [int(s) for s in self.hidden.split(",") if s.strip()]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) <= 0:
            raise ValueError(
                f"--hidden must be positive integers like 256,256, got {self.hidden!r}"
            )
        return sizes

    def local_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        return 0 if self.redis_url else (os.cpu_count() or 1)

    def epsilon(self, env_steps: int) -> float:
        frac = min(1.0, env_steps / max(1, self.eps_decay_steps))
        return self.eps_start + frac * (self.eps_end - self.eps_start)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def field_help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}
