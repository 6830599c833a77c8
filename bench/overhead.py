"""Pipeline overhead: one Celery worker collecting through Redis versus the same loop in-process.

Both sides step the same `pipeline.actor.Actor` (SyncVectorEnv of CartPole-v1) with the same fixed
256-256 `NumpyMLP` and epsilon-greedy. The pipeline side sends `collect_chunk` tasks to ONE local
worker (about two in flight) and reads the stream into a learner-side ReplayBuffer; its rate is
env steps between chunk arrivals after a warm-up. Repeats interleave the two sides so a change in
machine load hits both. A breakdown says where the pipeline's extra time per chunk goes.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from celery import Celery

from bench.common import median, table, write_results
from learner.replay import ReplayBuffer
from pipeline.actor import Actor, env_seeds, make_vector_env
from pipeline.connect import connect
from pipeline.dispatcher import TASK_NAME
from pipeline.embedded import Stack
from pipeline.keys import RunKeys
from pipeline.policy import NumpyMLP, epsilon_greedy
from pipeline.protocol import ChunkRequest
from pipeline.stream import TransitionReader, transition_specs
from pipeline.weights import WeightSource
from pipeline.worker import WorkerRuntime

ENV = "CartPole-v1"
OBS_SHAPE, NUM_ACTIONS = (4,), 2
SUCCEEDED = re.compile(rb"Task clusterenv\.collect_chunk\[[^\]]+\] succeeded in ([0-9.eE+-]+)s")


def fixed_weights(seed: int) -> dict[str, np.ndarray]:
    """A freshly initialised 256-256 Q-network, as the learner would publish as version 0."""
    import torch

    from learner.dqn import QNetwork

    torch.manual_seed(seed)
    return QNetwork(int(np.prod(OBS_SHAPE)), NUM_ACTIONS, [256, 256]).get_weights()


def in_process(
    weights: dict[str, np.ndarray],
    num_envs: int,
    steps: int,
    chunks: int,
    warmup: int,
    epsilon: float,
    seed: int,
) -> dict[str, float]:
    """Env steps/s of Actor.collect in a plain loop: no Celery, no Redis, no codec."""
    actor = Actor(make_vector_env(ENV, {}, num_envs), env_seeds(seed, 0, num_envs))
    policy, rng = NumpyMLP(weights), np.random.default_rng(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        return epsilon_greedy(policy(obs), epsilon, rng)

    try:
        for _ in range(warmup):
            actor.collect(act, steps)
        t0 = time.perf_counter()
        for _ in range(chunks):
            actor.collect(act, steps)
        wall = time.perf_counter() - t0
    finally:
        actor.close()
    return {"rate": chunks * num_envs * steps / wall, "chunk_ms": 1e3 * wall / chunks}


class PipelineBench:
    """The embedded server, one worker, and everything the learner side needs to drive it."""

    def __init__(self, stack: Stack, weights: dict[str, np.ndarray], log_path: Path):
        assert stack.redis_url is not None and stack.workers is not None
        self.url, self.weights, self.log_path = stack.redis_url, weights, log_path
        self.client = connect(self.url)
        self.worker = psutil.Process(stack.workers.pids[0])
        app = Celery("clusterenv-bench")
        app.config_from_object("celeryconfig")
        app.conf.broker_url = self.url
        self.app = app
        self._log_offset = 0

    def _task_runtimes(self) -> list[float]:
        """`succeeded in Xs` of the tasks the worker logged since the last call."""
        data = self.log_path.read_bytes()
        new, self._log_offset = data[self._log_offset :], len(data)
        return [float(m) for m in SUCCEEDED.findall(new)]

    def run(
        self,
        num_envs: int,
        steps: int,
        chunks: int,
        warmup: int,
        epsilon: float,
        seed: int,
        in_flight: int,
        timeout_s: float = 300.0,
    ) -> dict[str, float]:
        """Env steps/s from chunk `warmup` to the last, through Celery, the worker and the stream."""
        keys = RunKeys(f"bench-overhead-{uuid.uuid4().hex[:8]}")
        WeightSource(self.client, keys).publish(self.weights)
        reader = TransitionReader(
            connect(self.url, blocking=True),
            keys,
            transition_specs(np.float32, OBS_SHAPE),
            NUM_ACTIONS,
        )
        replay = ReplayBuffer(100_000, OBS_SHAPE, np.float32)
        arrivals: list[float] = []

        def sink(header: dict[str, Any], a: dict[str, np.ndarray]) -> None:
            replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])
            arrivals.append(time.perf_counter())

        template = {
            "run_id": keys.run_id,
            "env_id": ENV,
            "num_envs": num_envs,
            "steps": steps,
            "seed": seed,
            "epsilon": epsilon,
            "sync": "on-change",
        }
        total, sent = warmup + chunks, 0
        self._task_runtimes()
        deadline = time.monotonic() + timeout_s
        cpu0 = cpu1 = None
        while reader.stats.chunks < total:
            while sent < total and sent - reader.stats.chunks < in_flight:
                req = ChunkRequest(chunk_id=sent, **template)
                self.app.send_task(TASK_NAME, kwargs=req.to_json())
                sent += 1
            reader.poll(sink, block_ms=100)
            if cpu0 is None and reader.stats.chunks >= warmup:
                cpu0 = (self.worker.cpu_times(), time.process_time(), time.perf_counter())
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {reader.stats.chunks} of {total} chunks arrived")
        cpu1 = (self.worker.cpu_times(), time.process_time(), time.perf_counter())
        self.client.set(keys.stop, 1, ex=600)
        assert cpu0 is not None and reader.stats.duplicates == 0 and reader.stats.rejected == 0
        wall = arrivals[-1] - arrivals[warmup - 1]
        span = cpu1[2] - cpu0[2]
        runtimes = self._task_runtimes()[warmup:]
        return {
            "rate": chunks * num_envs * steps / wall,
            "chunk_ms": 1e3 * wall / chunks,
            "task_ms": 1e3 * statistics.fmean(runtimes) if runtimes else float("nan"),
            "worker_cpu": (sum(cpu1[0][:2]) - sum(cpu0[0][:2])) / span,
            "learner_cpu": (cpu1[1] - cpu0[1]) / span,
            "replay_rows": replay.inserted,
        }

    def breakdown(
        self, num_envs: int, steps: int, epsilon: float, seed: int, reps: int = 100
    ) -> dict[str, float]:
        """Per-chunk cost (ms) of the worker's own `run_chunk`, run here without Celery, by part."""
        keys = RunKeys(f"bench-overhead-probe-{uuid.uuid4().hex[:8]}")
        WeightSource(self.client, keys).publish(self.weights)
        runtime = WorkerRuntime(self.client, "bench-in-process")
        template = {
            "run_id": keys.run_id,
            "env_id": ENV,
            "num_envs": num_envs,
            "steps": steps,
            "seed": seed,
            "epsilon": epsilon,
            "sync": "on-change",
        }
        runtime.run_chunk(ChunkRequest(chunk_id=0, **template))  # creates the envs, fetches weights
        state = runtime.runs[keys.run_id]
        spent = {"collect": 0.0, "sync": 0.0, "write": 0.0}
        for name, obj, attr in (
            ("collect", state.actor, "collect"),
            ("sync", state.weights, "sync"),
            ("write", state.writer, "write"),
        ):
            setattr(obj, attr, _timed(getattr(obj, attr), spent, name))
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


def parse_shape(text: str) -> tuple[int, int]:
    envs, _, steps = text.lower().partition("x")
    return int(envs), int(steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    p.add_argument(
        "--shapes",
        default="8x32,8x128,16x64",
        help="chunk shapes ENVSxSTEPS, comma-separated (default: 8x32,8x128,16x64; 8x32 is train's default)",
    )
    p.add_argument(
        "--env-steps",
        type=int,
        default=80_000,
        help="env steps timed per shape and side, after warm-up (default: 80000)",
    )
    p.add_argument(
        "--warmup", type=int, default=10, help="chunks run before timing starts (default: 10)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved in-process/pipeline repeats per shape; medians are reported (default: 3)",
    )
    p.add_argument(
        "--in-flight", type=int, default=2, help="collect_chunk tasks kept in flight (default: 2)"
    )
    p.add_argument(
        "--epsilon", type=float, default=0.05, help="epsilon of the fixed epsilon-greedy policy"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the weights, envs and exploration")
    p.add_argument(
        "--out", type=Path, default=None, help="results JSON (default: bench/results/overhead.json)"
    )
    args = p.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]
    if args.warmup < 1 or args.repeats < 1 or args.env_steps < 1:
        p.error("--warmup, --repeats and --env-steps must be >= 1")

    weights = fixed_weights(args.seed)
    runs: list[dict[str, Any]] = []
    breakdowns: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "worker.log"
        with Stack(None, workers=1, log_path=log) as stack:
            bench = PipelineBench(stack, weights, log)
            for rep in range(args.repeats):
                for envs, steps in shapes:
                    chunks = max(1, args.env_steps // (envs * steps))
                    common = dict(
                        num_envs=envs,
                        steps=steps,
                        chunks=chunks,
                        warmup=args.warmup,
                        epsilon=args.epsilon,
                        seed=args.seed,
                    )
                    base = in_process(weights, **common)
                    pipe = bench.run(**common, in_flight=args.in_flight)
                    runs.append(
                        {
                            "shape": f"{envs}x{steps}",
                            "repeat": rep,
                            "chunks": chunks,
                            "in_process": base,
                            "pipeline": pipe,
                        }
                    )
                    print(
                        f"rep {rep} {envs}x{steps}: in-process {base['rate']:,.0f}/s, "
                        f"pipeline {pipe['rate']:,.0f}/s ({pipe['rate'] / base['rate']:.3f}x)",
                        flush=True,
                    )
            for envs, steps in shapes:
                breakdowns[f"{envs}x{steps}"] = bench.breakdown(
                    envs, steps, args.epsilon, args.seed
                )

    rows, summary = [], {}
    for envs, steps in shapes:
        name = f"{envs}x{steps}"
        mine = [r for r in runs if r["shape"] == name]
        base = median([r["in_process"]["rate"] for r in mine])
        pipe = median([r["pipeline"]["rate"] for r in mine])
        ratios = [r["pipeline"]["rate"] / r["in_process"]["rate"] for r in mine]
        bd = breakdowns[name]
        base_ms = median([r["in_process"]["chunk_ms"] for r in mine])
        pipe_ms = median([r["pipeline"]["chunk_ms"] for r in mine])
        task_ms = median([r["pipeline"]["task_ms"] for r in mine])
        summary[name] = {
            "in_process_rate": base,
            "pipeline_rate": pipe,
            "ratio_of_medians": pipe / base,
            "ratios": ratios,
            "in_process_chunk_ms": base_ms,
            "pipeline_chunk_ms": pipe_ms,
            "worker_task_ms": task_ms,
            "between_tasks_ms": pipe_ms - task_ms,
            "worker_cpu": median([r["pipeline"]["worker_cpu"] for r in mine]),
            "learner_cpu": median([r["pipeline"]["learner_cpu"] for r in mine]),
            **bd,
            "target_met": pipe / base >= 0.85,
        }
        rows.append(
            {
                "chunk": name,
                "in-process steps/s": base,
                "pipeline steps/s": pipe,
                "ratio": pipe / base,
                "min..max ratio": f"{min(ratios):.3f}..{max(ratios):.3f}",
                "≥0.85": "yes" if pipe / base >= 0.85 else "NO",
            }
        )
    print()
    print(table(rows, list(rows[0])))
    cost_map = {
        "in-process ms": "in_process_chunk_ms",
        "pipeline ms": "pipeline_chunk_ms",
        "worker task ms": "worker_task_ms",
        "between tasks ms": "between_tasks_ms",
        "run_chunk here ms": "run_chunk_ms",
        "  collect": "collect_ms",
        "  sync check": "sync_ms",
        "  encode+XADD": "write_ms",
        "  other": "other_ms",
        "worker CPU": "worker_cpu",
        "learner CPU": "learner_cpu",
    }
    cost_rows = [
        {"chunk": n} | {col: s[key] for col, key in cost_map.items()} for n, s in summary.items()
    ]
    cost_cols = ["chunk", *cost_map]
    print("\nPer chunk (medians; run_chunk and its parts timed in this process, same server):")
    print(table(cost_rows, cost_cols))
    path = write_results(
        "overhead",
        {"args": vars(args) | {"out": str(args.out)}, "summary": summary, "runs": runs},
        args.out,
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
