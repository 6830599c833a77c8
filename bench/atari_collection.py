"""Atari collection: env steps/s of `ALE/Pong-v5` with the Nature CNN acting, on clusterenv workers
and in one process.

Every side steps the same envs (pipeline/envs/: no-op starts, frame skip 4 with max-pooling, 84x84
grey, 4 stacked frames, episodic life and clipped rewards, as workers collect) with the same fixed
Nature DQN network through the workers' numpy forward (pipeline/policy.py) and epsilon-greedy:
- one process: gymnasium's SyncVectorEnv (every env in this process) and AsyncVectorEnv (a
  subprocess per env) under the workers' own Actor loop, no Celery, Redis or codec;
- clusterenv: 1 and 2 local `celery worker`s on the embedded server, `collect_chunk` tasks of
  ENVS x STEPS (the Atari preset's 8 x 128) kept in flight, the stream read into the learner's
  frame replay; the rate counts env steps between chunk arrivals after a warm-up.
Where the time goes: the policy's forward per chunk (one process), Celery's task runtime and the
CPU of each process per chunk, and a worker's `run_chunk` timed by part in this process.
Targets: none; issue 30 asks for the ratio and where the time goes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench.collect_rig import in_process, local_workers
from bench.common import mark_start, median, table, write_results
from bench.overhead import parse_shape
from clusterenv.learner.core.networks import build_network
from clusterenv.learner.spaces import env_spaces
from clusterenv.pipeline.policy import numpy_policy

ENV = "ALE/Pong-v5"
# Rig.breakdown's figures: a worker's run_chunk and its parts, ms per chunk.
PARTS = ("run_chunk_ms", "collect_ms", "sync_ms", "write_ms", "flush_ms", "other_ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.atari_collection", description=__doc__.split("\n")[0]
    )
    p.add_argument("--env", default=ENV, help=f"an ALE id (default: {ENV})")
    p.add_argument(
        "--shape",
        type=parse_shape,
        default=(8, 128),
        help="chunk ENVSxSTEPS; the one-process side steps ENVS envs (default: 8x128)",
    )
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default: 1,2)")
    p.add_argument(
        "--chunks",
        type=int,
        default=8,
        help="chunks timed per side and repeat, after warm-up (default: 8)",
    )
    p.add_argument("--warmup", type=int, default=2, help="chunks before timing (default: 2)")
    p.add_argument("--repeats", type=int, default=3, help="repeats; medians reported (default: 3)")
    p.add_argument(
        "--epsilon", type=float, default=0.05, help="epsilon of the fixed policy (default: 0.05)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the weights, envs and exploration")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default: bench/results/atari_collection.json)",
    )
    args = p.parse_args(argv)  # fmt: skip
    mark_start()
    envs, steps = args.shape
    counts = [int(k) for k in args.workers.split(",") if k.strip()]
    spaces, _ = env_spaces(args.env, {})
    import torch

    torch.manual_seed(args.seed)
    weights = build_network(spaces.obs.row_shape, spaces.action.n, "auto", []).get_weights()
    policy = numpy_policy(weights)
    common = dict(num_envs=envs, steps=steps, epsilon=args.epsilon, seed=args.seed)
    runs: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    runs |= {f"workers {k}": [] for k in counts}
    for rep in range(args.repeats):
        for vector in ("sync", "async"):
            r = in_process(policy, args.env, chunks=args.chunks, warmup=args.warmup,
                           vector=vector, **common)  # fmt: skip
            runs[vector].append(r)
            print(f"rep {rep} one process, {vector}: {r['rate']:,.0f} steps/s", flush=True)
    for k in counts:  # a pool of k workers per count, the repeats inside it
        with (
            tempfile.TemporaryDirectory() as tmp,
            local_workers(Path(tmp) / "worker.log", {}, k, args.env, spaces) as rig,
        ):
            for rep in range(args.repeats):
                r = rig.run(weights, chunks=args.chunks * k, warmup=args.warmup * k,
                            in_flight=2 * k, **common)  # fmt: skip
                if k == 1:  # the parts of one worker's run_chunk, here without Celery
                    r |= rig.breakdown(weights, reps=max(1, args.chunks // 2), **common)
                runs[f"workers {k}"].append(r)
                print(f"rep {rep} {k} worker(s): {r['rate']:,.0f} steps/s", flush=True)

    sync = median([r["rate"] for r in runs["sync"]])
    summary = {
        name: {key: median([r[key] for r in rs]) for key in rs[0]}
        | {"ratio_to_sync": median([r["rate"] for r in rs]) / sync}
        for name, rs in runs.items()
    }
    rows = [{"side": name, "env steps/s": s["rate"], "/ SyncVectorEnv": s["ratio_to_sync"],
             "ms per chunk": s["chunk_ms"], "forward ms": s.get("forward_ms"),
             "task ms": s.get("task_ms"), "worker CPU ms": s.get("worker_cpu_ms"),
             "learner CPU ms": s.get("learner_cpu_ms") if name.startswith("workers") else s["cpu_ms"],
             "server CPU ms": s.get("server_cpu_ms")}
            for name, s in summary.items()]  # fmt: skip
    print()
    print(table(rows, list(rows[0])))
    one = summary.get("workers 1", {})
    parts = {k: one[k] for k in PARTS if k in one}
    if parts:
        print("\nOne worker's run_chunk here (no Celery), ms per chunk:")
        print(table([parts], list(parts)))
    payload = {"args": vars(args) | {"out": str(args.out)}, "summary": summary, "runs": runs}
    path = write_results("atari_collection", payload, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
