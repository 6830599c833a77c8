"""Worker-computed initial priorities (issue 32, `--initial-priority worker`): their cost.

- worker: microseconds per transition to collect a chunk as a worker does (the env steps and the
  numpy forward that acts, pipeline/chunks/actor.py) and, on top, to turn the Q-values acting kept
  into each row's |n-step TD error| (pipeline/chunks/priorities.py), for CartPole-v1 (8 envs x 32
  steps, the 256-256 MLP) and MinAtar Breakout (its conv torso), n-step 1 and 3;
- learner: ingest transitions/s from a pre-filled stream on the embedded server through
  StreamReader.poll into a prioritized replay, chunks without a priority column (each row at the
  largest priority so far) against chunks with one (each row at its own), 256-row chunks.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.collect_rig import OBS_SHAPE, SPACES
from bench.common import mark_start, median, table, write_results
from bench.ingest import make_chunk, prefill
from clusterenv.learner.core.networks import build_network
from clusterenv.learner.replay.priorities import Prioritized
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.actor import Actor, env_seeds, make_vector_env
from clusterenv.pipeline.chunks.priorities import PRIORITY, q_columns, with_priorities
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.embedded import EmbeddedServer
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import numpy_policy

ENVS = {"CartPole-v1": [256, 256], "MinAtar/Breakout-v1": []}  # hidden sizes (conv: its own)


def worker_cost(env: str, chunks: int, n_steps: list[int]) -> dict[str, Any]:
    """Per transition: collecting (act + step) with the Q columns kept, and the priorities."""
    actor = Actor(make_vector_env(env, {}, 8, training=True), env_seeds(1, 0, 8))
    spaces = actor.spaces
    policy = numpy_policy(build_network(spaces.obs.row_shape, spaces.action.n, "auto",
                                        ENVS[env]).get_weights())  # fmt: skip
    behaviour, rng = EpsilonGreedy(0.1), np.random.default_rng(1)

    def act(obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        outputs = policy(obs)
        index, _ = behaviour.act(outputs, rng)
        return index, q_columns(outputs, index)

    collect_s, rows, priority_s = 0.0, 0, {n: 0.0 for n in n_steps}
    for _ in range(chunks):
        t0 = time.perf_counter()
        arrays = actor.collect(act, 32).arrays
        collect_s += time.perf_counter() - t0
        rows += len(arrays["action"])
        for n in n_steps:
            t0 = time.perf_counter()
            with_priorities(arrays, policy, n, 0.99)
            priority_s[n] += time.perf_counter() - t0
    actor.close()
    out = {"env": env, "rows": rows, "collect_us": 1e6 * collect_s / rows}
    for n in n_steps:
        out[f"priority_n{n}_us"] = 1e6 * priority_s[n] / rows
        out[f"priority_n{n}_share"] = priority_s[n] / collect_s
    return out


def ingest_rate(url: str, total: int, rows: int, priority: bool) -> float:
    """Transitions/s through StreamReader.poll into a prioritized replay of 100k rows."""
    run_id, rng = f"bench-prio-{uuid.uuid4().hex[:8]}", np.random.default_rng(0)
    keys = RunKeys(run_id)
    prefill(connect(url), keys, [make_chunk(run_id, i, rows, rng, priority) for i in range(total)])
    extra = {PRIORITY: ArraySpec("<f4", ())} if priority else None
    reader = StreamReader(connect(url, blocking=True), keys, SPACES, extra)
    replay = ReplayBuffer(100_000, OBS_SHAPE, np.float32, sampler=Prioritized(100_000, 0.6, 0.4))
    t0 = time.perf_counter()
    while reader.stats.chunks < total:
        reader.poll(lambda header, arrays: replay.insert(arrays), block_ms=1000, count=64)
    wall = time.perf_counter() - t0
    assert replay.inserted == total * rows and not reader.stats.rejected
    connect(url).delete(keys.stream)
    return replay.inserted / wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.worker_priorities",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--chunks", type=int, default=100, help="chunks per worker measurement")
    p.add_argument("--stream-chunks", type=int, default=400, help="chunks per ingest pass")
    p.add_argument("--repeats", type=int, default=3, help="interleaved ingest passes per kind")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default: bench/results/worker_priorities.json)",
    )
    args = p.parse_args(argv)
    mark_start()
    workers = [worker_cost(env, args.chunks, [1, 3]) for env in ENVS]
    server = EmbeddedServer()
    rates: dict[str, list[float]] = {"max": [], "worker": []}
    try:
        url = server.start()
        for _ in range(args.repeats):
            for kind in rates:
                rates[kind].append(ingest_rate(url, args.stream_chunks, 256, kind == "worker"))
    finally:
        server.stop()
    ingest = {kind: median(r) for kind, r in rates.items()}
    print(table(workers, ["env", "collect_us", "priority_n1_us", "priority_n1_share",
                          "priority_n3_us", "priority_n3_share"]))  # fmt: skip
    print(table([{"initial priority": k, "ingest transitions/s": v} for k, v in ingest.items()],
                ["initial priority", "ingest transitions/s"]))  # fmt: skip
    write_results("worker_priorities", {"worker": workers, "ingest": ingest, "ingest_runs": rates},
                  args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
