"""The learner's broker seams (pipeline/roles.py) in process: one fake per role (run flags, worker
directory, evaluation results, status board, transitions), workers played by a script, and
FakeCluster, all of them as the Broker a Run takes (learner/run/wiring.py). The learner's loop
runs on them without a server (tests/learner/test_loop.py); tests/pipeline/test_broker_roles.py
runs each fake and its Redis twin through the same script."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.roles import IngestStats, Sink
from tests.fakes import FakeWeightSource


class FakeRunFlags:
    """RunFlags in memory. Test side: `marker` and `stopped` as the broker would hold them, and
    `lose()`, a broker restarted without persistence."""

    def __init__(self) -> None:
        self.marker = False
        self.stopped = False

    def mark_started(self) -> None:
        self.marker = True

    def mark_stopped(self) -> None:
        self.stopped = True  # the marker stays until the run's keys expire

    def lost(self) -> bool:
        return not self.marker

    def lose(self) -> None:
        """The broker forgets the run's keys."""
        self.marker = self.stopped = False


class FakeWorkerDirectory:
    """A WorkerDirectory over a settable `workers` map, hostname → (processes, eval only); with
    `processes`, one collecting worker "worker-0" of that many. Test side: `announce` and
    `withdraw`, as WorkerRegistry's (less the heartbeat's TTL)."""

    def __init__(self, processes: int = 0) -> None:
        self.workers: dict[str, tuple[int, bool]] = {}
        if processes:
            self.announce("worker-0", processes)

    def announce(self, hostname: str, processes: int, eval_only: bool = False) -> None:
        self.workers[hostname] = (processes, eval_only)

    def withdraw(self, hostname: str) -> None:
        """The worker left, or its heartbeat lapsed."""
        self.workers.pop(hostname, None)

    def alive_processes(self, eval_only: bool = False) -> int:
        return sum(n for n, only in self.workers.values() if only == eval_only)

    def is_alive(self, hostname: str) -> bool:
        return hostname in self.workers


class FakeChunkTakers:
    """ChunkTakers over a dict chunk id → hostname. Test side: `note`, as RedisChunkTakers'."""

    def __init__(self) -> None:
        self.taken: dict[int, str] = {}

    def note(self, chunk_ids: Iterable[int], hostname: str) -> None:
        self.taken.update(dict.fromkeys(chunk_ids, hostname))

    def takers(self, chunk_ids: list[int]) -> dict[int, str]:
        return {c: self.taken[c] for c in chunk_ids if c in self.taken}

    def forget(self, chunk_ids: list[int]) -> None:
        for c in chunk_ids:
            self.taken.pop(c, None)


class FakeEvalResults:
    """EvalResults over a list of results and a dict of takers. Test side: `push(result)` (a
    worker's RPUSH) and `take(field, host)` (a worker noting it took a part)."""

    def __init__(self) -> None:
        self.results: deque[bytes] = deque()
        self.taken: dict[str, str] = {}

    def push(self, result: bytes | str) -> None:
        self.results.append(result.encode() if isinstance(result, str) else bytes(result))

    def take(self, field: str, host: str) -> None:
        self.taken[field] = host

    def pop(self) -> bytes | None:
        return self.results.popleft() if self.results else None

    def unread(self) -> int:
        return len(self.results)

    def takers(self, fields: list[str]) -> list[str]:
        return [self.taken[f] for f in fields if f in self.taken]

    def forget(self, fields: list[str]) -> None:
        for f in fields:
            self.taken.pop(f, None)


class FakeStatusBoard:
    """A StatusBoard in memory; statuses go through JSON as on the broker (no expiry). Test side:
    `statuses` (run id → status), and `error`: when set, `write` raises it (a broker failure)."""

    def __init__(self) -> None:
        self.statuses: dict[str, dict[str, Any]] = {}
        self.error: Exception | None = None

    def write(self, run_id: str, status: Mapping[str, Any]) -> None:
        if self.error is not None:
            raise self.error
        self.statuses[run_id] = json.loads(json.dumps(dict(status), default=str))

    def read_all(self) -> list[dict[str, Any]]:
        # In key order first, then newest first (a stable sort), as the Redis board reads them.
        by_key = sorted(self.statuses.items(), key=lambda item: RunKeys(item[0]).status)
        statuses = [json.loads(json.dumps(status)) for _, status in by_key]
        return sorted(statuses, key=lambda s: s.get("updated_at", 0), reverse=True)


class FakeTransitions:
    """A TransitionWriter and a TransitionReader in one, without a server or codec: `write` queues
    (header, arrays) as given; `poll` waits up to `block_ms` for one, hands up to `count` queued
    chunks to the sink, drops chunk ids (header["chunk"]) already seen, and keeps `stats` and
    `seen` as StreamReader does (nothing is validated: nothing is rejected). Thread-safe for
    writers and one poller. A sink that raises leaves its chunk and the batch's rest queued (the
    real reader leaves them pending for `claim_stale`); `claim_stale` finds nothing. Test side:
    `queued`."""

    def __init__(self) -> None:
        self.queued: deque[tuple[dict[str, Any], dict[str, np.ndarray]]] = deque()
        self.stats = IngestStats()
        self.seen: set[int] = set()
        self._ready = threading.Condition()

    def write(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        chunk = (dict(header), {k: np.array(v) for k, v in arrays.items()})
        with self._ready:
            self.queued.append(chunk)
            self._ready.notify_all()
        return sum(a.nbytes for a in chunk[1].values())

    def poll(self, sink: Sink, block_ms: int = 100, count: int = 64) -> int:
        with self._ready:
            if not self.queued and block_ms > 0:
                self._ready.wait(block_ms / 1000)
            batch = [self.queued.popleft() for _ in range(min(count, len(self.queued)))]
        accepted = 0
        for i, (header, arrays) in enumerate(batch):
            chunk_id = header["chunk"]
            if chunk_id in self.seen:
                self.stats.duplicates += 1
                continue
            try:
                sink(header, arrays)
            except BaseException:
                with self._ready:
                    self.queued.extendleft(reversed(batch[i:]))
                raise
            self.seen.add(chunk_id)
            rows = len(arrays["action"]) if arrays else 0
            self.stats.chunks += 1
            self.stats.transitions += rows
            accepted += rows
        return accepted

    def claim_stale(self, sink: Sink, min_idle_ms: int = 30_000, count: int = 64) -> int:
        return 0


class ScriptedWorkers:
    """A SendTask that plays the workers in process, at once: each `clusterenv.collect_chunk`
    writes its chunks (random CartPole-shaped transitions acted with the newest version) into
    `transitions`; each `clusterenv.evaluate` part pushes `eval_return` for each of its seeds
    into `evals`. `tasks` counts what was sent, by task name; every chunk is noted taken by
    "worker-0" in `takers`. With `env_error` set ({"kind", "error"}), every chunk is what a worker
    whose env fails at once sends: a header alone. With `dying` set to (hostname, n), the next n
    collect tasks are taken by that worker and never answered; then its heartbeat lapses (it is
    withdrawn from `workers`). With `silent_evals`, evaluation parts are taken and never answered
    (a worker stuck where nothing cuts it off). A request with `priority_n_step` gets a random
    `priority` column (what a worker's TD errors would be)."""

    def __init__(self, transitions: FakeTransitions, evals: FakeEvalResults,
                 weights: FakeWeightSource, takers: FakeChunkTakers, workers: FakeWorkerDirectory,
                 eval_return: float = 10.0, seed: int = 0):  # fmt: skip
        self.transitions, self.evals, self.weights = transitions, evals, weights
        self.takers, self.workers = takers, workers
        self.dying: tuple[str, int] | None = None
        self.eval_return = eval_return
        self.env_error: dict[str, str] | None = None
        self.silent_evals = False
        self.rng = np.random.default_rng(seed)
        self.tasks: dict[str, int] = {}
        self.last_behaviour: dict[str, Any] | None = None  # of the newest collect task
        self.last_request: dict[str, Any] = {}

    def __call__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.tasks[name] = self.tasks.get(name, 0) + 1
        if name == "clusterenv.evaluate":
            self.evals.take(f"{kwargs['eval_id']}:{kwargs['part']}", "worker-0")
            if self.silent_evals:
                return
            self.evals.push(json.dumps({
                "eval": kwargs["eval_id"], "part": kwargs["part"], "version": kwargs["version"],
                "returns": [self.eval_return] * len(kwargs["seeds"]), "worker": "worker-0",
            }))  # fmt: skip
            return
        self.last_behaviour, self.last_request = kwargs["behaviour"], kwargs
        rows, ids = (
            kwargs["num_envs"] * kwargs["steps"],
            range(kwargs["chunk_id"], kwargs["chunk_id"] + kwargs["chunks"]),
        )
        if self.dying is not None:
            host, left = self.dying
            self.takers.note(ids, host)
            self.dying = (host, left - 1) if left > 1 else None
            if self.dying is None:
                self.workers.withdraw(host)
            return
        self.takers.note(ids, "worker-0")
        for chunk in ids:
            if self.env_error is not None:
                self.transitions.write({"run": kwargs["run_id"], "chunk": chunk,
                                        "worker": "worker-0", "policy_version": -1,
                                        "env_steps": 0, "env_error": self.env_error}, {})  # fmt: skip
                continue
            obs = self.rng.normal(size=(rows + 1, 4)).astype(np.float32)
            arrays = {
                "obs": obs[:-1], "next_obs": obs[1:],
                "action": self.rng.integers(2, size=rows), "reward": np.ones(rows, np.float32),
                "terminated": self.rng.random(rows) < 0.05, "truncated": np.zeros(rows, bool),
                "env_index": np.tile(np.arange(kwargs["num_envs"], dtype=np.int32), kwargs["steps"]),
                "logp": np.full(rows, np.log(0.5), np.float32),
            }  # fmt: skip
            if kwargs.get("priority_n_step"):
                arrays["priority"] = self.rng.exponential(size=rows).astype(np.float32)
            header = {"run": kwargs["run_id"], "chunk": chunk, "worker": "worker-0",
                      "policy_version": self.weights.version, "env_steps": rows,
                      "sync": {"weight_fetches": 1}, "episodes": [[20.0, 20]]}  # fmt: skip
            self.transitions.write(header, arrays)


class FakeCluster:
    """Every role of a run's broker (learner/run/wiring.py's Broker) in process, with workers
    played by ScriptedWorkers: `factory` is the BrokerFactory a Run takes."""

    def __init__(self, processes: int = 2, eval_return: float = 10.0) -> None:
        self.weights, self.transitions = FakeWeightSource(), FakeTransitions()
        self.evals, self.flags = FakeEvalResults(), FakeRunFlags()
        self.workers, self.status = FakeWorkerDirectory(processes), FakeStatusBoard()
        self.takers = FakeChunkTakers()
        self.send = ScriptedWorkers(self.transitions, self.evals, self.weights, self.takers,
                                    self.workers, eval_return)  # fmt: skip
        self.stopped_runs: list[str] = []

    def factory(self, specs: Mapping[str, Any], num_actions: int) -> Any:
        from clusterenv.learner.run.wiring import Broker  # the learner extra: torch

        return Broker(self.weights, self.transitions, self.send, self.workers, self.takers,
                      self.evals,
                      self.flags, self.status, self.stopped_runs.append)  # fmt: skip
