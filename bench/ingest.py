"""Ingest: transitions/s the learner reads from the stream, decodes, validates, inserts and acks.

A stream on an embedded server is pre-filled with chunks of CartPole-sized transitions encoded by
`clusterenv.pipeline.codec.encode_chunk` with the header fields workers write. The full path is
`StreamReader.poll()` into a `clusterenv.learner.replay.uniform.ReplayBuffer` (read, decode, validate, dedupe,
insert, ack + delete); the bare path is XREADGROUP + np.frombuffer + XACK only. Optionally, one
`clusterenv train` run gives the ingest thread's CPU share of the learner's wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis

from bench.collect_rig import NUM_ACTIONS, OBS_SHAPE, SPACES
from bench.common import TRAIN, mark_start, median, table, write_results
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.pipeline.chunks.stream import StreamReader, check_content, transition_specs
from clusterenv.pipeline.cluster.embedded import EmbeddedServer
from clusterenv.pipeline.codec import decode_chunk, encode_chunk
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import ARRAY_FIELD_PREFIX, RunKeys

SPECS = transition_specs(SPACES)
DTYPES = {ARRAY_FIELD_PREFIX + name.encode(): np.dtype(spec.dtype) for name, spec in SPECS.items()}


def make_chunk(
    run_id: str, chunk_id: int, rows: int, rng: np.random.Generator, priority: bool = False
) -> dict[bytes, bytes]:
    """Stream fields of one chunk, with the header a worker writes (pipeline/chunks/runtime.py);
    with `priority`, the column a worker adds with --initial-priority worker."""
    obs = rng.normal(size=(rows + 1, *OBS_SHAPE)).astype(np.float32)
    arrays = {
        "obs": obs[:-1],
        "action": rng.integers(NUM_ACTIONS, size=rows).astype(np.int64),
        "reward": np.ones(rows, np.float32),
        "next_obs": obs[1:],
        "terminated": rng.random(rows) < 0.02,
        "truncated": np.zeros(rows, bool),
        "env_index": np.tile(np.arange(8, dtype=np.int32), rows // 8 + 1)[:rows],
    }
    if priority:
        arrays["priority"] = rng.exponential(size=rows).astype(np.float32)
    header = {
        "run": run_id,
        "chunk": chunk_id,
        "worker": "local0-bench@host:1234",
        "actor": 0,
        "policy_version": chunk_id // 4,
        "divergence": None,
        "env_steps": rows,
        "episodes": [[float(rng.integers(10, 500)), int(rng.integers(10, 500))] for _ in range(4)],
        "sync": {
            "version_checks": chunk_id + 1,
            "weight_fetches": chunk_id // 4 + 1,
            "weight_bytes": 270_000 * (chunk_id // 4 + 1),
            "probe_fetches": 0,
            "probe_bytes": 0,
        },
    }
    return encode_chunk(header, arrays)


def prefill(client: redis.Redis, keys: RunKeys, chunks: list[dict[bytes, bytes]]) -> None:
    """XADD every chunk (pipelined) and create the learner's consumer group."""
    client.delete(keys.stream)
    pipe = client.pipeline(transaction=False)
    for i, fields in enumerate(chunks):
        pipe.xadd(keys.stream, fields)
        if i % 64 == 63:
            pipe.execute()
    pipe.execute()
    client.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)


def full_path(url: str, keys: RunKeys, total: int, rows: int, count: int) -> dict[str, float]:
    """StreamReader.poll into a ReplayBuffer until `total` chunks are in; transitions/s."""
    reader = StreamReader(connect(url, blocking=True), keys, SPACES)
    replay = ReplayBuffer(100_000, OBS_SHAPE, np.float32)

    def sink(header: dict[str, Any], a: dict[str, np.ndarray]) -> None:
        replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])

    t0, c0 = time.perf_counter(), time.process_time()
    while reader.stats.chunks < total:
        reader.poll(sink, block_ms=1000, count=count)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = reader.stats
    assert s.transitions == total * rows == replay.inserted and not s.rejected and not s.duplicates
    return {"rate": s.transitions / wall, "wall_s": wall, "cpu_s": cpu}


def bare_path(url: str, keys: RunKeys, total: int, rows: int, count: int) -> dict[str, float]:
    """XREADGROUP + np.frombuffer of every array + XACK, nothing else; transitions/s."""
    client = connect(url, blocking=True)
    got = transitions = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while got < total:
        reply = client.xreadgroup(keys.group, "bare", {keys.stream: ">"}, count=count, block=1000)
        if not reply:
            continue
        entries = reply[0][1]
        for _, fields in entries:
            arrays = {k: np.frombuffer(v, DTYPES[k]) for k, v in fields.items() if k in DTYPES}
            transitions += len(arrays[ARRAY_FIELD_PREFIX + b"action"])
        client.xack(keys.stream, keys.group, *[e for e, _ in entries])
        got += len(entries)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert transitions == total * rows
    return {"rate": transitions / wall, "wall_s": wall, "cpu_s": cpu}


def parts(chunks: list[dict[bytes, bytes]], run_id: str, rows: int) -> dict[str, float]:
    """Microseconds per chunk of decode, checks and replay insert, with no Redis involved."""
    replay = ReplayBuffer(100_000, OBS_SHAPE, np.float32)
    spent = {"decode_us": 0.0, "check_us": 0.0, "insert_us": 0.0}
    for fields in chunks:
        t0 = time.perf_counter()
        header, a = decode_chunk(fields, SPECS)
        t1 = time.perf_counter()
        check_content(header, a, run_id, SPACES.action)
        t2 = time.perf_counter()
        replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])
        t3 = time.perf_counter()
        spent["decode_us"] += t1 - t0
        spent["check_us"] += t2 - t1
        spent["insert_us"] += t3 - t2
    per = {k: 1e6 * v / len(chunks) for k, v in spent.items()}
    per["in_process_rate"] = rows * 1e6 / sum(per.values())
    return per


def train_share(seed: int, extra: list[str]) -> dict[str, Any]:
    """One default `clusterenv train` run; the ingest thread's CPU time over learner wall time."""
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        cmd = [*TRAIN, "--seed", str(seed), "--run-dir", tmp]
        t0 = time.perf_counter()
        subprocess.run([*cmd, *extra], check=True, stdout=subprocess.DEVNULL)
        process_wall = time.perf_counter() - t0
        (summary_path,) = Path(tmp).glob("*/summary.json")
        summary = json.loads(summary_path.read_text())
    return {
        "seed": seed,
        "ingest_cpu_fraction": summary["ingest_cpu_fraction"],
        "wall_s": summary["wall_s"],
        "process_wall_s": round(process_wall, 3),
        "env_steps": summary["env_steps"],
        "solved": summary["solved"],
        "chunks": summary["ingest"]["chunks"],
        "transitions": summary["ingest"]["transitions"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=400, help="chunks per timed pass (default: 400)")
    p.add_argument(
        "--rows",
        default="1024,256",
        help="transitions per chunk, comma-separated (default: 1024,256; train's chunks are ~250)",
    )
    p.add_argument(
        "--count", type=int, default=64, help="XREADGROUP COUNT, as the trainer uses (default: 64)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="interleaved passes of each path; medians reported"
    )
    p.add_argument(
        "--train",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run `clusterenv train` once for the ingest thread's share (default: on)",
    )
    p.add_argument(
        "--train-seed", type=int, default=1, help="seed of that training run (default: 1)"
    )
    p.add_argument(
        "--train-args", default="", help="extra flags for that run, e.g. '--total-steps 20000'"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="results JSON (default: bench/results/ingest.json)"
    )
    args = p.parse_args(argv)
    mark_start()
    if min(args.chunks, args.repeats, args.count) < 1:
        p.error("--chunks, --repeats and --count must be >= 1")
    row_sizes = [int(r) for r in args.rows.split(",") if r.strip()]

    rng = np.random.default_rng(0)
    passes: list[dict[str, Any]] = []
    breakdown: dict[int, dict[str, float]] = {}
    server = EmbeddedServer()
    try:
        url = server.start()
        client = connect(url)
        for rows in row_sizes:
            run_id = f"bench-ingest-{uuid.uuid4().hex[:8]}"
            chunks = [make_chunk(run_id, i, rows, rng) for i in range(args.chunks)]
            breakdown[rows] = parts(chunks, run_id, rows)
            for rep in range(args.repeats):
                for name, fn in (("full", full_path), ("bare", bare_path)):
                    keys = RunKeys(run_id)
                    prefill(client, keys, chunks)
                    res = fn(url, keys, args.chunks, rows, args.count)
                    passes.append({"rows": rows, "repeat": rep, "path": name, **res})
                    print(
                        f"{rows} rows, rep {rep}, {name}: {res['rate']:,.0f} transitions/s",
                        flush=True,
                    )
            client.delete(RunKeys(run_id).stream)
    finally:
        server.stop()

    rows_out, summary = [], {}
    for rows in row_sizes:
        full = median([x["rate"] for x in passes if x["rows"] == rows and x["path"] == "full"])
        bare = median([x["rate"] for x in passes if x["rows"] == rows and x["path"] == "bare"])
        cpu = median(
            [x["cpu_s"] / x["wall_s"] for x in passes if x["rows"] == rows and x["path"] == "full"]
        )
        summary[rows] = {
            "full_rate": full,
            "bare_rate": bare,
            "full_over_bare": full / bare,
            "full_cpu_over_wall": cpu,
            **breakdown[rows],
            "target_met": full >= 1e6,
        }
        b = breakdown[rows]
        rows_out.append(
            {
                "chunk rows": rows,
                "full path /s": full,
                "bare loop /s": bare,
                "full/bare": full / bare,
                "decode µs": b["decode_us"],
                "checks µs": b["check_us"],
                "insert µs": b["insert_us"],
                "≥1M/s": "yes" if full >= 1e6 else "NO",
            }
        )
    print()
    print(table(rows_out, list(rows_out[0])))
    payload: dict[str, Any] = {
        "args": vars(args) | {"out": str(args.out)},
        "summary": summary,
        "passes": passes,
    }
    if args.train:
        share = train_share(args.train_seed, args.train_args.split())
        share["target_met"] = share["ingest_cpu_fraction"] <= 0.05
        payload["training"] = share
        print()
        print(
            table(
                [
                    {
                        "run": f"clusterenv train --seed {share['seed']}",
                        "ingest CPU / wall": share["ingest_cpu_fraction"],
                        "learner wall s": share["wall_s"],
                        "env steps": share["env_steps"],
                        "chunks": share["chunks"],
                        "≤5%": "yes" if share["target_met"] else "NO",
                    }
                ],
                ["run", "ingest CPU / wall", "learner wall s", "env steps", "chunks", "≤5%"],
            )
        )
    path = write_results("ingest", payload, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
