"""The pipeline side of bench/overhead.py and bench/atari_collection.py: local workers, chunk
dispatch, stream reads, timings by part.

`local_workers` starts an embedded server and local `celery worker`s (the plain `Stack`, or one
worker with some celeryconfig settings overridden for what-if runs). `Rig.run` keeps a few
`collect_chunk` tasks in flight and reads the stream into the learner's replay for the env's
spaces (frames stored once for pixel envs), timing chunk arrivals and the CPU each process spent;
`Rig.breakdown` times the parts of the worker's own `run_chunk` (collect, sync check, encode +
XADD) in this process, with no Celery around it.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from clusterenv.learner.dqn.builder import replay_for
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.actor import Actor, env_seeds, make_vector_env
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.runtime import WorkerRuntime
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.embedded import (
    EmbeddedServer,
    LocalWorkers,
    Stack,
    die_with_parent,
)
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.envs.make import make_env
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.spaces import DiscreteActions, SpaceSpecs
from clusterenv.pipeline.sync.source import RedisWeightSource

ENV = "CartPole-v1"
OBS_SHAPE, NUM_ACTIONS = (4,), 2
SPACES = SpaceSpecs(ArraySpec("<f4", OBS_SHAPE), DiscreteActions(NUM_ACTIONS))
# Celery logs this line per task; the runtime covers the task function (run_chunk) only.
SUCCEEDED = re.compile(rb"Task clusterenv\.collect_chunk\[[^\]]+\] succeeded in ([0-9.eE+-]+)s")


def chunk_template(
    run_id: str, env: str, num_envs: int, steps: int, seed: int, epsilon: float
) -> dict[str, Any]:
    """ChunkRequest fields every chunk of one measurement shares (all but the chunk id)."""
    return {"run_id": run_id, "env_id": env, "num_envs": num_envs, "steps": steps,
            "seed": seed, "behaviour": EpsilonGreedy(epsilon), "sync": "on-change"}  # fmt: skip


def in_process(
    policy: Callable[[np.ndarray], np.ndarray],
    env: str,
    num_envs: int,
    steps: int,
    chunks: int,
    warmup: int,
    epsilon: float,
    seed: int,
    vector: str = "sync",
) -> dict[str, float]:
    """Env steps/s of Actor.collect in a plain loop: no Celery, no Redis, no codec. `vector`:
    gymnasium's SyncVectorEnv (every env in this process, as a worker steps them) or
    AsyncVectorEnv (a subprocess per env, stepped in parallel). Beside the rate: wall and CPU
    (this process) per chunk and the policy's forward per chunk."""
    if vector == "sync":
        envs = make_vector_env(env, {}, num_envs, training=True)
    else:
        envs = gym.vector.AsyncVectorEnv(
            [lambda: make_env(env, {}, training=True) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
    actor = Actor(envs, env_seeds(seed, 0, num_envs))
    rng, behaviour, forward = np.random.default_rng(seed), EpsilonGreedy(epsilon), [0.0]

    def act(obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        t0 = time.perf_counter()
        values = policy(obs)
        forward[0] += time.perf_counter() - t0
        return behaviour.act(values, rng)

    try:
        for _ in range(warmup):
            actor.collect(act, steps)
        forward[0] = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(chunks):
            actor.collect(act, steps)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        actor.close()
    return {
        "rate": chunks * num_envs * steps / wall,
        "chunk_ms": 1e3 * wall / chunks,
        "cpu_ms": 1e3 * cpu / chunks,
        "forward_ms": 1e3 * forward[0] / chunks,
    }


class TunedWorkers(LocalWorkers):
    """LocalWorkers whose process overrides some `celeryconfig` settings before Celery reads them."""

    def __init__(self, redis_url: str, log_path: Path, settings: dict[str, Any]):
        super().__init__(redis_url, 1, log_path)
        self.settings = settings

    def _spawn(self, i: int, env: dict[str, str], log: Any) -> subprocess.Popen:
        # `worker_pool` (e.g. threads) is the CLI's --pool, which outranks celeryconfig.
        pool = self.settings.get("worker_pool", "solo")
        argv = [
            "worker",
            "--pool",
            pool,
            "--concurrency",
            "1",
            "--loglevel",
            "INFO",
            "--hostname",
            f"tuned{i}-{self.tag}@%h",
        ]
        boot = (
            "import json, sys; from clusterenv import celeryconfig\n"
            "for k, v in json.loads(sys.argv[1]).items(): setattr(celeryconfig, k, v)\n"
            "from clusterenv.tasks import app\n"
            "app.worker_main(json.loads(sys.argv[2]))\n"
        )
        cmd = [sys.executable, "-c", boot, json.dumps(self.settings), json.dumps(argv)]
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


class Rig:
    """Drives the workers through Celery and reads their chunks like the learner does."""

    def __init__(
        self,
        url: str,
        worker_pids: list[int],
        server_pid: int | None,
        log_path: Path,
        env: str = ENV,
        spaces: SpaceSpecs = SPACES,
    ):
        self.url, self.log_path, self.env, self.spaces = url, log_path, env, spaces
        self.client = connect(url)
        self.workers = [psutil.Process(pid) for pid in worker_pids]
        self.server = psutil.Process(server_pid) if server_pid else None
        self.app = celery_client(url, "clusterenv-bench")
        self._log_offset = 0

    def _task_runtimes(self) -> list[float]:
        """`succeeded in Xs` of the tasks the worker logged since the last call."""
        data = self.log_path.read_bytes()
        new, self._log_offset = data[self._log_offset :], len(data)
        return [float(m) for m in SUCCEEDED.findall(new)]

    def _cpu(self) -> tuple[float, float, float, float]:
        server = _cpu_s(self.server) if self.server else float("nan")
        # A prefork worker's chunks run in its children: their CPU counts as the worker's.
        workers = sum(_cpu_s(p) for w in self.workers for p in [w, *w.children(recursive=True)])
        return time.perf_counter(), workers, time.process_time(), server

    def run(
        self,
        weights: dict[str, np.ndarray],
        num_envs: int,
        steps: int,
        chunks: int,
        warmup: int,
        epsilon: float,
        seed: int,
        in_flight: int,
        per_task: int = 1,
        timeout_s: float = 300.0,
    ) -> dict[str, float]:
        """Env steps/s from the arrival of chunk `warmup` to the last; ms and CPU ms per chunk.
        Tasks of `per_task` chunks each, `in_flight` tasks at a time."""
        keys = RunKeys(f"bench-overhead-{uuid.uuid4().hex[:8]}")
        RedisWeightSource(self.client, keys).publish(weights)
        reader = StreamReader(connect(self.url, blocking=True), keys, self.spaces)
        replay = replay_for(self.spaces, DQNConfig(buffer_size=100_000))
        arrivals: list[float] = []

        def sink(header: dict[str, Any], a: dict[str, np.ndarray]) -> None:
            replay.insert(a)
            arrivals.append(time.perf_counter())

        template = chunk_template(keys.run_id, self.env, num_envs, steps, seed, epsilon)
        total, sent, start = -(-(warmup + chunks) // per_task) * per_task, 0, None
        chunks = total - warmup
        self._task_runtimes()
        deadline = time.monotonic() + timeout_s
        while reader.stats.chunks < total:
            while sent < total and sent - reader.stats.chunks < in_flight * per_task:
                req = ChunkRequest(chunk_id=sent, chunks=per_task, **template)
                self.app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
                sent += per_task
            reader.poll(sink, block_ms=100)
            if start is None and reader.stats.chunks >= warmup:
                start = self._cpu()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {reader.stats.chunks} of {total} chunks arrived")
        end = self._cpu()
        self.client.set(keys.stop, 1, ex=600)
        assert start is not None and reader.stats.duplicates == reader.stats.rejected == 0
        assert replay.inserted == reader.stats.transitions
        wall = arrivals[-1] - arrivals[warmup - 1]
        runtimes = self._task_runtimes()[warmup // per_task :]
        per_chunk = [1e3 * (b - a) / chunks for a, b in zip(start, end, strict=True)]
        return {
            "rate": chunks * num_envs * steps / wall,
            "chunk_ms": 1e3 * wall / chunks,
            # Celery's runtime of a task, per chunk it carried
            "task_ms": 1e3 * statistics.fmean(runtimes) / per_task if runtimes else float("nan"),
            "worker_cpu_ms": per_chunk[1],  # all workers together
            "learner_cpu_ms": per_chunk[2],
            "server_cpu_ms": per_chunk[3],
        }

    def breakdown(
        self,
        weights: dict[str, np.ndarray],
        num_envs: int,
        steps: int,
        epsilon: float,
        seed: int,
        reps: int,
    ) -> dict[str, float]:
        """ms per chunk of the worker's own `run_chunk`, run here without Celery, and of its parts."""
        keys = RunKeys(f"bench-overhead-parts-{uuid.uuid4().hex[:8]}")
        RedisWeightSource(self.client, keys).publish(weights)
        runtime = WorkerRuntime(self.client, "bench-in-process")
        template = chunk_template(keys.run_id, self.env, num_envs, steps, seed, epsilon)
        runtime.run_chunk(ChunkRequest(chunk_id=0, **template))  # creates the envs, fetches weights
        state = runtime.runs.get(keys.run_id)
        assert state is not None
        # The chunk's XADD waits in the outbox: it is sent with the next sync check, and the
        # task's last one by the flush.
        spent = {"collect": 0.0, "sync": 0.0, "write": 0.0, "flush": 0.0}
        for name, obj in (
            ("collect", state.actor),
            ("sync", state.weights),
            ("write", state.writer),
            ("flush", runtime.outbox),
        ):
            setattr(obj, name, _timed(getattr(obj, name), spent, name))
        t0 = time.perf_counter()
        for i in range(reps):
            runtime.run_chunk(ChunkRequest(chunk_id=i + 1, **template))
        total = time.perf_counter() - t0
        state.actor.close()
        self.client.delete(keys.stream)
        parts = {f"{k}_ms": 1e3 * v / reps for k, v in spent.items()}
        rest = 1e3 * total / reps - sum(parts.values())
        return {"run_chunk_ms": 1e3 * total / reps, **parts, "other_ms": rest}


def _timed(fn: Callable[..., Any], spent: dict[str, float], name: str) -> Callable[..., Any]:
    """`fn`, adding its wall time to `spent[name]` on every call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0

    return wrapper


@contextmanager
def local_workers(
    log: Path,
    settings: dict[str, Any],
    count: int = 1,
    env: str = ENV,
    spaces: SpaceSpecs = SPACES,
) -> Iterator[Rig]:
    """An embedded server and `count` local workers: the plain Stack, or (one worker only) one
    whose celeryconfig `settings` are overridden."""
    if not settings:
        with Stack(None, workers=count, log_path=log) as stack:
            assert stack.redis_url and stack.workers and stack.server
            yield Rig(stack.redis_url, stack.workers.pids, stack.server.pid, log, env, spaces)
        return
    if count != 1:
        raise ValueError("overridden worker settings: one worker only")
    server = EmbeddedServer()
    workers: TunedWorkers | None = None
    try:
        url = server.start()
        workers = TunedWorkers(url, log, settings)
        workers.start()
        workers.wait_ready(connect(url), 1)
        yield Rig(url, workers.pids, server.pid, log, env, spaces)
    finally:
        if workers is not None:
            workers.stop()
        server.stop()
