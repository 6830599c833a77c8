"""Pipeline overhead: one Celery worker collecting through Redis versus the same loop in-process.

Both sides step the same `clusterenv.pipeline.chunks.actor.Actor` (SyncVectorEnv of CartPole-v1) with the same
fixed 256-256 `NumpyMLP` and epsilon-greedy. The pipeline side sends `collect_chunk` tasks to ONE
local worker (two in flight) and reads the stream into a learner-side ReplayBuffer; its rate is env
steps between chunk arrivals after a warm-up. Each repeat runs the in-process loop, the pipeline
and a timing of the worker's `run_chunk` by part back to back, so a change in machine load hits all
three; medians over repeats are reported, wall and CPU per chunk beside the rates.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.collect_rig import ENV, NUM_ACTIONS, OBS_SHAPE, in_process, local_workers
from bench.common import mark_start, median, table, write_results
from clusterenv.pipeline.policy import NumpyMLP

TARGET = 0.85


def fixed_weights(seed: int) -> dict[str, np.ndarray]:
    """A freshly initialised 256-256 Q-network, as the learner would publish as version 0."""
    import torch

    from clusterenv.learner.core.networks import MLP

    torch.manual_seed(seed)
    return MLP(int(np.prod(OBS_SHAPE)), NUM_ACTIONS, [256, 256]).get_weights()


def parse_shape(text: str) -> tuple[int, int]:
    """'8x32' -> (8 envs, 32 steps)."""
    envs, sep, steps = text.lower().partition("x")
    if not sep or not envs.isdigit() or not steps.isdigit() or int(envs) < 1 or int(steps) < 1:
        raise argparse.ArgumentTypeError(f"expected ENVSxSTEPS like 8x32, got {text!r}")
    return int(envs), int(steps)


def variant_name(envs: int, steps: int, per_task: int) -> str:
    """'8x32' for one chunk per task, '8x32 k4' for four."""
    return f"{envs}x{steps}" + (f" k{per_task}" if per_task > 1 else "")


def parse_setting(text: str) -> tuple[str, Any]:
    """NAME=VALUE, VALUE as JSON if it parses (2, false, "x"), else as a plain string."""
    name, sep, raw = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


def summarize(runs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Medians over the repeats of one shape."""
    mine = [r for r in runs if r["shape"] == name]

    def med(side: str, key: str) -> float:
        return median([r[side][key] for r in mine])

    base, pipe = med("in_process", "rate"), med("pipeline", "rate")
    out = {
        "in_process_rate": base,
        "pipeline_rate": pipe,
        "ratio": pipe / base,
        "ratios": [r["pipeline"]["rate"] / r["in_process"]["rate"] for r in mine],
    }
    for key in ("chunk_ms", "cpu_ms"):
        out[f"in_process_{key}"] = med("in_process", key)
    for key in ("chunk_ms", "task_ms", "worker_cpu_ms", "learner_cpu_ms", "server_cpu_ms"):
        out[f"pipeline_{key}"] = med("pipeline", key)
    out["pipeline_between_tasks_ms"] = median(
        [r["pipeline"]["chunk_ms"] - r["pipeline"]["task_ms"] for r in mine]
    )
    for key in mine[0]["parts"]:
        out[f"run_chunk_{key}"] = med("parts", key)
    out["target_met"] = out["ratio"] >= TARGET
    return out


def print_tables(summary: dict[str, dict[str, Any]]) -> None:
    rates = [
        {
            "chunk": n,
            "in-process steps/s": s["in_process_rate"],
            "pipeline steps/s": s["pipeline_rate"],
            "ratio": s["ratio"],
            "per-repeat ratios": " ".join(f"{x:.2f}" for x in s["ratios"]),
            f"≥{TARGET}": "yes" if s["target_met"] else "NO",
        }
        for n, s in summary.items()
    ]
    print(table(rates, list(rates[0])))
    wall = {
        "in-process": "in_process_chunk_ms",
        "pipeline": "pipeline_chunk_ms",
        "= worker task": "pipeline_task_ms",
        "+ between tasks": "pipeline_between_tasks_ms",
        "run_chunk here": "run_chunk_run_chunk_ms",
        "· collect": "run_chunk_collect_ms",
        "· sync check (+ held XADD)": "run_chunk_sync_ms",
        "· encode": "run_chunk_write_ms",
        "· flush (last XADD)": "run_chunk_flush_ms",
        "· other": "run_chunk_other_ms",
    }
    print(
        "\nWall ms per chunk (worker task: Celery's 'succeeded in'; run_chunk here: the same "
        "WorkerRuntime.run_chunk called in this process, no Celery):"
    )
    print(
        table(
            [{"chunk": n} | {c: s[k] for c, k in wall.items()} for n, s in summary.items()],
            ["chunk", *wall],
        )
    )
    cpu = {
        "in-process": "in_process_cpu_ms",
        "worker": "pipeline_worker_cpu_ms",
        "learner side": "pipeline_learner_cpu_ms",
        "server": "pipeline_server_cpu_ms",
    }
    print("\nCPU ms per chunk (pipeline: each process, while the timed chunks ran):")
    print(
        table(
            [{"chunk": n} | {c: s[k] for c, k in cpu.items()} for n, s in summary.items()],
            ["chunk", *cpu],
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    p.add_argument(
        "--shapes",
        default="8x32,16x64,8x128",
        help="chunk shapes ENVSxSTEPS, comma-separated; 8x32 is train's default "
        "(default: 8x32,16x64,8x128)",
    )
    p.add_argument(
        "--env-steps",
        type=int,
        default=80_000,
        help="env steps timed per shape, side and repeat, after warm-up (default: 80000)",
    )
    p.add_argument(
        "--warmup", type=int, default=10, help="chunks run before timing starts (default: 10)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="repeats per shape; medians are reported (default: 3)",
    )
    p.add_argument(
        "--in-flight", type=int, default=2, help="collect_chunk tasks kept in flight (default: 2)"
    )
    p.add_argument(
        "--chunks-per-task",
        default="1",
        help="chunks one collect_chunk task carries (train's --chunks-per-task), comma-separated; "
        "each value is measured for every shape (default: 1)",
    )
    p.add_argument(
        "--epsilon", type=float, default=0.05, help="epsilon of the fixed policy (default: 0.05)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the weights, envs and exploration")
    p.add_argument(
        "--worker-setting",
        type=parse_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a celeryconfig setting in the worker only, for what-if runs (repeatable; "
        "e.g. worker_send_task_events=false, worker_prefetch_multiplier=2)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="results JSON (default: bench/results/overhead.json)"
    )
    args = p.parse_args(argv)
    mark_start()
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    try:
        per_tasks = [int(k) for k in args.chunks_per_task.split(",")]
    except ValueError:
        p.error(f"--chunks-per-task: expected integers like 1,4, got {args.chunks_per_task!r}")
    if min(args.warmup, args.repeats, args.env_steps, args.in_flight, *per_tasks) < 1 or not shapes:
        p.error(
            "--warmup, --repeats, --env-steps, --in-flight and --chunks-per-task must be >= 1, "
            "--shapes non-empty"
        )
    variants = [(envs, steps, k) for envs, steps in shapes for k in per_tasks]

    weights = fixed_weights(args.seed)
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        local_workers(Path(tmp) / "worker.log", dict(args.worker_setting)) as rig,
    ):
        for rep in range(args.repeats):
            for envs, steps, per_task in variants:
                chunks = max(1, args.env_steps // (envs * steps))
                common = dict(num_envs=envs, steps=steps, epsilon=args.epsilon, seed=args.seed)
                base = in_process(
                    NumpyMLP(weights), ENV, chunks=chunks, warmup=args.warmup, **common
                )
                pipe = rig.run(
                    weights, chunks=chunks, warmup=args.warmup, in_flight=args.in_flight,
                    per_task=per_task, **common,
                )  # fmt: skip
                parts = rig.breakdown(weights, reps=max(1, chunks // 2), **common)
                runs.append(
                    {
                        "shape": variant_name(envs, steps, per_task),
                        "chunks_per_task": per_task,
                        "repeat": rep,
                        "chunks": chunks,
                        "in_process": base,
                        "pipeline": pipe,
                        "parts": parts,
                    }
                )
                print(
                    f"rep {rep} {variant_name(envs, steps, per_task)}: in-process {base['rate']:,.0f}/s, pipeline "
                    f"{pipe['rate']:,.0f}/s ({pipe['rate'] / base['rate']:.3f}x)",
                    flush=True,
                )

    names = [variant_name(*v) for v in variants]
    summary = {name: summarize(runs, name) for name in names}
    print()
    print_tables(summary)
    args_json = vars(args) | {"out": str(args.out), "worker_setting": dict(args.worker_setting)}
    path = write_results(
        "overhead", {"args": args_json, "summary": summary, "runs": runs}, args.out
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
