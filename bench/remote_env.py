"""Remote vector env: step latency, throughput against a local SyncVectorEnv, slow-env scaling.

One run, one embedded server, `--max-workers` local solo workers:
  1. a Celery task round trip (send the bench-only `bench.echo`, BLPOP its reply) — the
     alternative transport;
  2. CartPole-v1 at 8 and 64 envs per worker on 1 and 2 workers: step() p50/p99 and env steps/s,
     beside a local SyncVectorEnv of the same total size (ratio = remote / local);
  3. a slow CartPole (~1 ms sleep per step, bench.envs) at 8 envs per worker on 1..8 workers:
     scaling efficiency = rate(W) / (W x rate(1)).
Run from the repository root:  .venv/bin/python -m bench.remote_env
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (
    None,
    "",
):  # `python bench/remote_env.py` as well as `python -m bench.remote_env`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym
import numpy as np

from bench.common import table, write_results
from bench.echo import ECHO_TASK, echo_reply
from bench.echo import MODULE as ECHO_MODULE
from bench.envs import SLOW_CARTPOLE
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.embedded import Stack
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.remote_env import RemoteVectorEnv

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = "CartPole-v1"


def timed_steps(envs: gym.vector.VectorEnv, seconds: float, min_steps: int) -> np.ndarray:
    """Seconds per step() call, for at least `seconds` and `min_steps`, after a short warm-up."""
    n = envs.num_envs
    actions = np.random.default_rng(0).integers(0, 2, size=(4096, n))
    envs.reset(seed=0)
    for a in actions[:50]:
        envs.step(a)
    out: list[float] = []
    start = time.perf_counter()
    while len(out) < min_steps or time.perf_counter() - start < seconds:
        a = actions[len(out) % len(actions)]
        t0 = time.perf_counter()
        envs.step(a)
        out.append(time.perf_counter() - t0)
    return np.asarray(out)


def local(env_id: str, num_envs: int, seconds: float) -> float:
    """Env steps per second of a local SyncVectorEnv."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(num_envs)])
    try:
        return num_envs / float(np.mean(timed_steps(envs, seconds, 100)))
    finally:
        envs.close()


def remote(url: str, env_id: str, workers: int, per_worker: int, seconds: float) -> dict[str, Any]:
    envs = RemoteVectorEnv(env_id, workers * per_worker, redis_url=url, shards=workers)
    try:
        lat = timed_steps(envs, seconds, 300)
    finally:
        envs.close()
    return {
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
        "steps_per_s": workers * per_worker / float(np.mean(lat)),
    }


def celery_round_trip(url: str, samples: int) -> dict[str, float]:
    """send_task -> a worker runs `bench.echo` -> it RPUSHes -> we BLPOP: p50/p99 in ms."""
    app, client = celery_client(url), connect(url, blocking=True)
    out = []
    try:
        for i in range(samples + 10):
            token = uuid.uuid4().hex
            t0 = time.perf_counter()
            app.send_task(ECHO_TASK, args=[token])
            if client.blpop([echo_reply(token)], timeout=10) is None:
                raise TimeoutError(f"no worker answered {ECHO_TASK} within 10 s")
            if i >= 10:
                out.append(time.perf_counter() - t0)
    finally:
        app.close()
    return {
        "p50_ms": float(np.percentile(out, 50) * 1e3),
        "p99_ms": float(np.percentile(out, 99) * 1e3),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0, help="timing window per configuration")
    p.add_argument("--max-workers", type=int, default=8, help="largest worker count (slow env)")
    p.add_argument("--out", type=Path, default=None, help="results JSON path")
    args = p.parse_args(argv)
    # Workers import bench.envs by id: make the repo importable for them wherever we were run.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    counts = sorted({w for w in (1, 2, 4, 8) if w <= args.max_workers} | {args.max_workers})
    # The workers import bench.echo beside clusterenv.tasks: the round trip's task is bench-only.
    with Stack(None, workers=args.max_workers, include=[ECHO_MODULE]) as stack:
        url = stack.redis_url
        rtt = celery_round_trip(url, 200)
        print(f"Celery task round trip: p50 {rtt['p50_ms']:.2f} ms, p99 {rtt['p99_ms']:.2f} ms")

        cart = []
        for workers, per in [(1, 8), (2, 4), (1, 64), (2, 32), (2, 64)]:
            row = {"workers": workers, "envs_per_worker": per, "envs": workers * per}
            row.update(remote(url, CARTPOLE, workers, per, args.seconds))
            row["local_steps_per_s"] = local(CARTPOLE, workers * per, args.seconds)
            row["ratio"] = row["steps_per_s"] / row["local_steps_per_s"]
            cart.append(row)
            print(row)
        cols = ["workers", "envs_per_worker", "envs", "p50_ms", "p99_ms", "steps_per_s"]
        print(table(cart, [*cols, "local_steps_per_s", "ratio"]))

        slow = []
        for workers in counts:
            row = {"workers": workers, "envs": 8 * workers}
            row.update(remote(url, SLOW_CARTPOLE, workers, 8, args.seconds))
            slow.append(row)
        base = slow[0]["steps_per_s"]
        for row in slow:
            row["efficiency"] = row["steps_per_s"] / (row["workers"] * base)
        local_slow = local(SLOW_CARTPOLE, 8, args.seconds)
        print(table(slow, ["workers", "envs", "p50_ms", "p99_ms", "steps_per_s", "efficiency"]))
        print(f"local SyncVectorEnv of 8 slow envs: {local_slow:,.0f} steps/s")

    path = write_results(
        "remote_env",
        {
            "celery_round_trip": rtt,
            "cartpole": cart,
            "slow_env": {"delay_s": 0.001, "envs_per_worker": 8, "rows": slow},
            "local_slow_8_steps_per_s": local_slow,
            "seconds_per_config": args.seconds,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
