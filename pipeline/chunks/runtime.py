"""What a worker process keeps between chunks (envs, policy, stream writer) and how it runs one."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from clusterenv.pipeline.behaviour import EnvEpsilons
from clusterenv.pipeline.chunks.actor import Actor, env_seeds, make_vector_env
from clusterenv.pipeline.chunks.priorities import q_columns, with_priorities
from clusterenv.pipeline.chunks.request import ChunkRequest
from clusterenv.pipeline.chunks.slots import ActorSlots
from clusterenv.pipeline.chunks.stream import StreamWriter
from clusterenv.pipeline.chunks.takers import RedisChunkTakers
from clusterenv.pipeline.envs.faults import EnvFault
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.outbox import Outbox
from clusterenv.pipeline.roles import SlotLease, TransitionWriter, WeightClient
from clusterenv.pipeline.sync.client import RedisWeightClient
from clusterenv.pipeline.sync.rules import parse_sync

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """One run's live state inside a worker process."""

    actor: Actor
    weights: WeightClient
    writer: TransitionWriter
    actor_index: int  # this process's start number in the run: its envs' seeds
    slots: SlotLease
    slot: int  # its slot in the run: its envs' rungs of an exploration ladder
    rng: np.random.Generator

    def close(self) -> None:
        try:
            self.actor.close()
        except Exception as exc:  # the user's env; the worker goes on without it either way
            log.warning("closing the envs failed: %s: %s", type(exc).__name__, exc)
        try:
            self.slots.release()
        except redis.RedisError as exc:  # a dead process's slot is taken over anyway
            log.warning("releasing actor slot %d failed: %s", self.slot, exc)


class RunCache:
    """The runs a worker process serves, least recently used first; the oldest past `size` is closed."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a worker must cache at least one run, got {size}")
        self.size = size
        self._runs: OrderedDict[str, RunState] = OrderedDict()

    def get(self, run_id: str) -> RunState | None:
        state = self._runs.get(run_id)
        if state is not None:
            self._runs.move_to_end(run_id)
        return state

    def put(self, run_id: str, state: RunState) -> None:
        old = self._runs.get(run_id)
        if old is not None and old is not state:
            old.close()
        self._runs[run_id] = state
        self._runs.move_to_end(run_id)
        while len(self._runs) > self.size:
            _, old = self._runs.popitem(last=False)
            old.close()

    def drop(self, run_id: str) -> None:
        state = self._runs.pop(run_id, None)
        if state is not None:
            state.close()

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._runs

    def __len__(self) -> int:
        return len(self._runs)


class WorkerRuntime:
    """Per-process cache of runs; `run_chunk` is all a task calls."""

    def __init__(
        self,
        client: redis.Redis,
        worker_name: str,
        max_cached_runs: int = 2,
        stopping: Callable[[], bool] = lambda: False,
    ):
        """`stopping()`: the worker is shutting down (tasks/app.py): the chunk in progress ends
        at its next step and is sent with what it has; no further chunk of the task starts."""
        self.client = client
        self.worker_name = worker_name
        self.stopping = stopping
        # The name in the worker registry (worker names are "hostname:pid", tasks/collect.py).
        self.hostname = worker_name.rpartition(":")[0] or worker_name
        self.runs = RunCache(max_cached_runs)
        # A chunk's XADD rides with the next chunk's sync check; each task flushes the last one.
        self.outbox = Outbox(client)

    def _start_run(self, req: ChunkRequest) -> RunState:
        keys = RunKeys(req.run_id)
        # Seeds from a counter (a restarted process's envs start new episodes, not its
        # predecessor's again); the ladder's rungs from a slot (a restarted process takes its
        # predecessor's: pipeline/chunks/slots.py).
        index = int(self.client.incr(keys.actor_counter)) - 1
        seeds = env_seeds(req.seed, index, req.num_envs)
        slots = ActorSlots(self.client, keys, self.worker_name)
        rule = parse_sync(req.sync, req.max_lag_versions, req.max_lag_seconds, type(req.behaviour))
        actor = Actor(
            make_vector_env(req.env_id, req.env_kwargs, req.num_envs, training=True), seeds
        )
        return RunState(
            actor=actor,
            # Reference states are read as the env's own observations (dtype and shape).
            weights=RedisWeightClient(self.client, keys, rule, actor.spaces.obs, self.outbox),
            writer=StreamWriter(self.client, keys, self.outbox),
            actor_index=index,
            slots=slots,
            slot=slots.claim(),
            rng=np.random.default_rng(seeds[0]),
        )

    def run_chunk(self, req: ChunkRequest) -> dict[str, Any]:
        """The request's chunks back to back, each with its own stop check, sync check and stream
        entry; returns the small summary Flower shows once every chunk it collected is stored.
        A chunk whose env fails (EnvFault) ends there: it goes to the learner with the steps
        before the fault and the fault in its header, the run's envs are closed, and the next
        chunk builds them anew."""
        done: list[dict[str, Any]] = []
        # This worker took the task's chunks: noted with the first sync check's round trip, so
        # the learner writes them off at once should this worker die (pipeline/chunks/takers.py).
        takers, chunk_ids = RedisChunkTakers(self.client, RunKeys(req.run_id)), req.chunk_ids()
        self.outbox.hold(lambda pipe: takers.note(chunk_ids, self.hostname, pipe))
        for chunk_id in chunk_ids:
            if self.stopping():  # a preempted worker: the learner replaces the rest
                break
            state = self.runs.get(req.run_id)
            # A run first seen here is checked before its envs are built; a cached one's sync
            # check reads the stop key in its own round trip (collect_chunk gives None).
            if state is None and not self.client.exists(RunKeys(req.run_id).stop):
                try:
                    state = self._start_run(req)
                except EnvFault as fault:  # making or resetting the envs failed
                    done.append(self._report_fault(req, chunk_id, fault))
                    continue
                self.runs.put(req.run_id, state)
            summary = (
                None
                if state is None
                else collect_chunk(state, req, chunk_id, self.worker_name, self.stopping)
            )
            if summary is None:  # the sync check that saw the stop also sent the held XADD
                self.runs.drop(req.run_id)
                return {**merge_summaries(req, done), "skipped": "run stopped"}
            if "env_error" in summary:
                log.warning("chunk %d of %s: env fault in %s: %s; its envs are built anew",
                            chunk_id, req.run_id, summary["env_error"]["kind"],
                            summary["env_error"]["error"])  # fmt: skip
                self.runs.drop(req.run_id)
            done.append(summary)
        self.outbox.flush()  # the last chunk's XADD
        return merge_summaries(req, done)

    def _report_fault(self, req: ChunkRequest, chunk_id: int, fault: EnvFault) -> dict[str, Any]:
        """A chunk that could not start (its envs failed to build or reset) goes to the learner
        as a header alone, naming the fault: the learner counts it at once (no write-off)."""
        log.warning("chunk %d of %s: env fault in %s: %s", chunk_id, req.run_id, fault.kind,
                    fault.error)  # fmt: skip
        header = {"run": req.run_id, "chunk": chunk_id, "worker": self.worker_name,
                  "policy_version": -1, "env_steps": 0, "env_error": fault.report()}  # fmt: skip
        StreamWriter(self.client, RunKeys(req.run_id), self.outbox).write(header, {})
        return {"chunk": chunk_id, "worker": self.worker_name, "steps": 0, "transitions": 0,
                "episodes_finished": 0, "bytes": 0, "env_error": fault.report()}  # fmt: skip


def collect_chunk(
    state: RunState,
    req: ChunkRequest,
    chunk_id: int,
    worker_name: str,
    stopping: Callable[[], bool] = lambda: False,
) -> dict[str, Any] | None:
    """One chunk with a run's live state: sync check (which also sees a stopped run: None),
    act as the request's behaviour says, write; its summary."""
    behaviour = req.behaviour.for_actor(state.slot, req.num_envs)
    policy = state.weights.sync(behaviour)
    if policy is None:
        return None
    to_env, prioritize = state.actor.spaces.action.from_index, req.priority_n_step > 0
    acting = behaviour.acting(policy, req.num_envs, state.rng)

    def act(obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        outputs, index, extra = acting(obs)
        if prioritize:  # the Q-values acting saw, for the rows' initial priorities
            extra = {**extra, **q_columns(outputs, index)}
        return to_env(index), extra

    chunk = state.actor.collect(act, req.steps, req.time_limit_s, stopping)
    arrays = chunk.arrays
    if prioritize and len(arrays["action"]):
        arrays = with_priorities(arrays, policy, req.priority_n_step, req.priority_gamma)
    state.weights.record_steps(chunk.env_steps)
    counters = state.weights.counters_json()
    header = {
        "run": req.run_id,
        "chunk": chunk_id,
        "worker": worker_name,
        "actor": state.actor_index,
        "slot": state.slot,
        "policy_version": state.weights.version,
        "divergence": state.weights.last_divergence,
        "env_steps": chunk.env_steps,
        "episodes": chunk.episodes,
        "sync": counters,
    }
    transitions = len(arrays["action"])
    if chunk.fault is not None:
        header["env_error"] = chunk.fault.report()
    if chunk.preempted:
        header["preempted"] = True
    if isinstance(behaviour, EnvEpsilons):  # a ladder: which ε each of this actor's envs had
        header["epsilons"] = list(behaviour.epsilons)
    # A chunk without a transition (its env failed on the first step) is a header alone.
    nbytes = state.writer.write(header, arrays if transitions else {})
    summary = {
        "chunk": chunk_id,
        "worker": worker_name,
        "steps": chunk.env_steps,
        "transitions": transitions,
        "episodes_finished": len(chunk.episodes),
        "policy_version": state.weights.version,
        "bytes": nbytes,
        **counters,
    }
    if chunk.fault is not None:
        summary["env_error"] = chunk.fault.report()
    if chunk.preempted:
        summary["preempted"] = True
    return summary


_SUMMED = ("steps", "transitions", "episodes_finished", "bytes")


def merge_summaries(req: ChunkRequest, done: list[dict[str, Any]]) -> dict[str, Any]:
    """One task's summary: sums over its chunks, the last chunk's version and (cumulative)
    counters; `chunks_done` of the `chunks` asked for."""
    merged: dict[str, Any] = dict(done[-1]) if done else {}
    merged.update({key: sum(d[key] for d in done) for key in _SUMMED})
    merged.update(chunk=req.chunk_id, chunks=req.chunks, chunks_done=len(done),
                  env_errors=sum("env_error" in d for d in done))  # fmt: skip
    return merged
