"""What a worker process keeps between chunks (envs, policy, stream writer) and how it runs one."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from pipeline.actor import Actor, env_seeds, make_vector_env
from pipeline.keys import RunKeys
from pipeline.policy import epsilon_greedy
from pipeline.protocol import ChunkRequest
from pipeline.stream import TransitionWriter
from pipeline.sync import parse_sync
from pipeline.weights import WeightClient

# A worker process serves at most this many runs at once; the oldest is closed first.
MAX_CACHED_RUNS = 2


@dataclass
class RunState:
    """One run's live state inside a worker process."""

    actor: Actor
    weights: WeightClient
    writer: TransitionWriter
    actor_index: int
    rng: np.random.Generator
    chunks: int = 0


class WorkerRuntime:
    """Per-process cache of runs; `run_chunk` is all a task calls."""

    def __init__(self, client: redis.Redis, worker_name: str):
        self.client = client
        self.worker_name = worker_name
        self.runs: OrderedDict[str, RunState] = OrderedDict()

    def _state(self, req: ChunkRequest) -> RunState:
        state = self.runs.get(req.run_id)
        if state is not None:
            self.runs.move_to_end(req.run_id)
            return state
        keys = RunKeys(req.run_id)
        index = int(self.client.incr(keys.actor_counter)) - 1
        seeds = env_seeds(req.seed, index, req.num_envs)
        actor = Actor(make_vector_env(req.env_id, req.env_kwargs, req.num_envs), seeds)
        state = RunState(
            actor=actor,
            weights=WeightClient(
                self.client, keys, parse_sync(req.sync, req.max_lag_versions, req.max_lag_s)
            ),
            writer=TransitionWriter(self.client, keys),
            actor_index=index,
            rng=np.random.default_rng(seeds[0]),
        )
        self.runs[req.run_id] = state
        while len(self.runs) > MAX_CACHED_RUNS:
            _, old = self.runs.popitem(last=False)
            old.actor.close()
        return state

    def run_chunk(self, req: ChunkRequest) -> dict[str, Any]:
        """Sync check, collect, write to the stream; returns the small summary Flower shows."""
        keys = RunKeys(req.run_id)
        if self.client.exists(keys.stop):
            stale = self.runs.pop(req.run_id, None)
            if stale is not None:
                stale.actor.close()
            return {"chunk": req.chunk_id, "skipped": "run stopped"}
        state = self._state(req)
        policy = state.weights.sync(req.epsilon)
        chunk = state.actor.collect(
            lambda obs: epsilon_greedy(policy(obs), req.epsilon, state.rng), req.steps
        )
        state.weights.record_steps(chunk.env_steps)
        state.chunks += 1
        header = {
            "run": req.run_id,
            "chunk": req.chunk_id,
            "worker": self.worker_name,
            "actor": state.actor_index,
            "policy_version": state.weights.version,
            "divergence": state.weights.last_divergence,
            "env_steps": chunk.env_steps,
            "episodes": chunk.episodes,
            "sync": state.weights.counters_json(),
        }
        nbytes = state.writer.write(header, chunk.arrays)
        return {
            "chunk": req.chunk_id,
            "worker": self.worker_name,
            "steps": chunk.env_steps,
            "transitions": int(len(chunk.arrays["action"])),
            "episodes_finished": len(chunk.episodes),
            "policy_version": state.weights.version,
            "bytes": nbytes,
            **state.weights.counters_json(),
        }
