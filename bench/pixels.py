"""Pixels on the wire and in replay: bytes per transition and the learner's ingest rate.

Chunks are collected by the workers' own Actor from a frame-stacked env (`ALE/Pong-v5` with the
DQN wrapper stack of pipeline/envs/, random actions), so they carry each frame once as the
workers send them (pipeline/frames.py). Measured:
- wire: bytes of the encoded stream entries per transition;
- ingest: transitions/s from a pre-filled stream on the embedded server through StreamReader.poll
  (read, decode, validate, dedupe) into the learner's sink (DQN's frame replay,
  learner/replay/frames.py, already full as mid-run, and the reference pool), then ack;
- replay: its bytes per transition it can still sample, once filled past its capacity twice;
- a version of the Nature DQN net (issue 30, item 5): its bytes, the learner's publish (weights and
  probe) and a worker's fetch and load, in float32 and as `--weights-dtype float16` publishes it,
  and what APS's probes cost on uint8 reference states (the probe's numpy forward on the learner,
  the reference batch's and the probe's bytes).
Targets (issue 30): ingest >= 50,000 transitions/s; wire and replay <= 7.5 KB per transition.
"""

from __future__ import annotations

import argparse
import itertools
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine, mark_start, median, table, write_results
from clusterenv.learner.core.networks import build_network
from clusterenv.learner.replay.frames import FrameReplay
from clusterenv.learner.run.publisher import ReferencePool, wire_weights
from clusterenv.pipeline.chunks.actor import Actor, env_seeds, make_vector_env
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.embedded import EmbeddedServer
from clusterenv.pipeline.codec import encode_chunk
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import load_policy, numpy_policy
from clusterenv.pipeline.sync.source import RedisWeightSource, reference_pool_rows

FRAME_BYTES = 84 * 84


def collect(env: str, envs: int, steps: int, chunks: int, seed: int) -> tuple[list, Any]:
    """`chunks` chunks of `envs` x `steps` env steps, collected as a worker does."""
    actor = Actor(make_vector_env(env, {}, envs, training=True), env_seeds(seed, 0, envs))
    rng = np.random.default_rng(seed)
    n = actor.spaces.action.n

    def act(obs: np.ndarray) -> tuple[np.ndarray, dict]:
        return rng.integers(n, size=len(obs)), {}

    out = [actor.collect(act, steps).arrays for _ in range(chunks)]
    actor.close()
    return out, actor.spaces


def header(run_id: str, chunk: int, rows: int) -> dict[str, Any]:
    return {"run": run_id, "chunk": chunk, "worker": "bench@host:1", "policy_version": 0,
            "env_steps": rows, "episodes": [], "sync": {"weight_fetches": 1}}  # fmt: skip


def ingest_rate(url: str, chunks: list, spaces: Any, total: int, capacity: int) -> dict[str, float]:
    """Pre-fill a stream with `total` chunks (the collected ones over again), then time the
    learner's path from the stream into the frame replay."""
    client, run_id = connect(url), f"bench-pixels-{uuid.uuid4().hex[:8]}"
    keys = RunKeys(run_id)
    pipe = client.pipeline(transaction=False)
    rows = 0
    for i in range(total):
        arrays = chunks[i % len(chunks)]
        rows += len(arrays["action"])
        pipe.xadd(keys.stream, encode_chunk(header(run_id, i, len(arrays["action"])), arrays))
        if i % 16 == 15:
            pipe.execute()
    pipe.execute()
    reader = StreamReader(connect(url, blocking=True), keys, spaces)
    # A replay already full, as mid-run: the first pass over a fresh one also pays the kernel's
    # first touch of every page (its arrays are allocated lazily), once per run.
    replay = FrameReplay(capacity, spaces.stack, spaces.frame, spaces.action.array)
    for arrays in itertools.cycle(chunks):
        if replay.inserted >= capacity:
            break
        replay.insert(arrays)
    # The learner's sink (learner/run/wiring.py): replay, and the newest observations kept as
    # the pool reference states are drawn from (256 reference states: 2,560 observations).
    pool = ReferencePool(reference_pool_rows(256))

    def sink(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        pool.add(arrays)
        replay.insert(arrays)

    t0, c0 = time.perf_counter(), time.process_time()
    while reader.stats.chunks < total:
        reader.poll(sink, block_ms=1000, count=16)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert reader.stats.transitions == rows and not reader.stats.rejected
    client.delete(keys.stream)
    return {"rate": rows / wall, "wall_s": wall, "cpu_s": cpu, "transitions": rows}


def replay_bytes(chunks: list, spaces: Any, capacity: int) -> dict[str, float]:
    """Fill a frame replay past twice its capacity; bytes per transition it can still sample."""
    replay = FrameReplay(capacity, spaces.stack, spaces.frame, spaces.action.array)
    i = 0
    while replay.inserted < 2 * capacity:
        replay.insert(chunks[i % len(chunks)])
        i += 1
    alive = int(replay._alive(np.arange(replay.size)).sum())
    return {"bytes_per_transition": replay.nbytes / alive, "alive": alive, "capacity": capacity,
            "frames_per_transition": replay.frame_count / replay.inserted}  # fmt: skip


def version_cost(
    url: str, chunks: list, spaces: Any, reference_size: int, repeats: int, dtype: str = "float32"
) -> dict:
    """Bytes and milliseconds of one published version of the Nature DQN net (as `dtype`:
    --weights-dtype), with its probe on `reference_size` uint8 reference states, and of a
    worker's fetch and load of it."""
    net = build_network(spaces.obs.row_shape, spaces.action.n, "auto", [])
    weights = wire_weights(net.get_weights(), dtype)
    client, keys = connect(url), RunKeys(f"bench-pixels-{uuid.uuid4().hex[:8]}")
    source = RedisWeightSource(client, keys)
    pool = ReferencePool(reference_pool_rows(reference_size))
    for arrays in chunks:
        pool.add(arrays)
    states = pool.recent(reference_size)
    t0 = time.perf_counter()
    source.publish_reference(states)
    reference_ms = 1e3 * (time.perf_counter() - t0)
    times: dict[str, list[float]] = {"probe_ms": [], "publish_ms": [], "fetch_load_ms": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        probe = numpy_policy(weights)(states)
        t1 = time.perf_counter()
        version = source.publish(weights, probe)
        t2 = time.perf_counter()
        load_policy(client.get(keys.weights(version)))
        t3 = time.perf_counter()
        for name, ms in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[name].append(1e3 * ms)
    sizes = {name: sum(len(k) + len(v) for k, v in client.hgetall(key).items())
             for name, key in (("reference_bytes", keys.reference(0)),
                               ("probe_bytes", keys.probe(version)))}  # fmt: skip
    sizes["weight_bytes"] = len(client.get(keys.weights(version)))
    client.delete(*client.keys(f"{keys.base}:*"))
    return {"parameters": sum(a.size for a in weights.values()), "reference_size": reference_size,
            "weights_dtype": dtype,
            "reference_ms": reference_ms, **sizes, **{k: median(v) for k, v in times.items()}}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="ALE/Pong-v5", help="a frame-stacked env id")
    p.add_argument("--envs", type=int, default=8, help="envs per chunk (a worker's)")
    p.add_argument("--steps", type=int, default=128, help="steps per env in a chunk")
    p.add_argument("--chunks", type=int, default=8, help="distinct chunks collected")
    p.add_argument("--stream-chunks", type=int, default=64, help="chunks ingested per repeat")
    p.add_argument("--capacity", type=int, default=50_000, help="frame replay capacity")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="results file (default: bench/results/pixels.json)")
    args = p.parse_args()
    mark_start()
    chunks, spaces = collect(args.env, args.envs, args.steps, args.chunks, args.seed)
    rows = sum(len(c["action"]) for c in chunks)
    wire = sum(sum(len(v) for v in encode_chunk(header("r", 0, 0), c).values()) for c in chunks)
    server = EmbeddedServer()
    try:
        url = server.start()
        runs = [ingest_rate(url, chunks, spaces, args.stream_chunks, args.capacity)
                for _ in range(args.repeats)]  # fmt: skip
        versions = [version_cost(url, chunks, spaces, size, args.repeats, dtype)
                    for size, dtype in ((256, "float32"), (32, "float32"), (256, "float16"))]  # fmt: skip
    finally:
        server.stop()
    memory = replay_bytes(chunks, spaces, args.capacity)
    result = {
        "env": args.env,
        "chunk": f"{args.envs}x{args.steps}",
        "wire_bytes_per_transition": wire / rows,
        "frames_per_transition_on_wire": sum(len(c["frames"]) for c in chunks) / rows,
        "ingest_transitions_per_s": median([r["rate"] for r in runs]),
        "ingest_runs": runs,
        "replay": memory,
        "versions": versions,
    }
    print(table([{
        "env": args.env, "chunk": result["chunk"],
        "wire B/transition": round(result["wire_bytes_per_transition"]),
        "replay B/transition": round(memory["bytes_per_transition"]),
        "frame": FRAME_BYTES,
        "ingest transitions/s (median)": round(result["ingest_transitions_per_s"]),
    }], ["env", "chunk", "wire B/transition", "replay B/transition", "frame",
         "ingest transitions/s (median)"]))  # fmt: skip
    print(table([{
        "reference states": v["reference_size"], "weights": v["weights_dtype"],
        "version MB": round(v["weight_bytes"] / 1e6, 2),
        "publish ms": round(v["publish_ms"], 1), "fetch+load ms": round(v["fetch_load_ms"], 1),
        "probe forward ms": round(v["probe_ms"], 1), "probe B": v["probe_bytes"],
        "reference MB": round(v["reference_bytes"] / 1e6, 2),
    } for v in versions], ["reference states", "weights", "version MB", "publish ms", "fetch+load ms",
                           "probe forward ms", "probe B", "reference MB"]))  # fmt: skip
    print(f"machine: {machine()}")
    write_results(
        "pixels", {"args": {**vars(args), "out": str(args.out)}, "result": result}, args.out
    )


if __name__ == "__main__":
    main()
