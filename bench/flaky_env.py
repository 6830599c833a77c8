"""A crashing and stalling CartPole against the same env with its stalls alone (issue 31's rates:
a crash per 10,000 steps and per 1,000 resets, a 2-5 s stall per 2,000 steps, RLlib's
CartPoleCrashing figures), `clusterenv train` with default flags: does it reach the eval bar
within the budget, and do crashes cost only their own chunk (env steps/s close to the stalls-only
env's) rather than a worker slot for --lost-after-s?

    python -m bench.flaky_env --seeds 1,2,3

Both arms of a seed run back to back in one invocation, so a change in machine load hits both.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import mark_start, median, table, train_run, write_results
from bench.envs import FLAKY_CARTPOLE, FLAKY_RATES

ARMS = {
    "crashes+stalls": FLAKY_RATES,
    "stalls only": {**FLAKY_RATES, "step_crash_p": 0.0, "reset_crash_p": 0.0},
}


def one_run(rates: dict[str, Any], seed: int, budget: int, target: float, runs_dir: Path,
            stop: bool = True) -> dict:  # fmt: skip
    flags = ["--env", FLAKY_CARTPOLE, "--env-kwargs", json.dumps(rates), "--seed", str(seed),
             "--total-steps", str(budget), "--target-return", str(target if stop else 1e9)]  # fmt: skip
    run = train_run(flags, runs_dir, "flaky-")
    s = run["summary"]
    hit = next((r for r in run["rows"] if r["eval/return_mean"] >= target), None)
    return {
        "seed": seed, "solved": bool(s["solved"]), "env_steps": s["env_steps"],
        "wall_s": s["wall_s"], "steps_per_s": s["env_steps"] / s["wall_s"],
        "steps_to_target": hit["env_steps"] if hit else None,
        "wall_to_target_s": hit["wall_s"] if hit else None,
        "best_eval": max(r["eval/return_mean"] for r in run["rows"]),
        "env_errors": s["env_errors"], "lost_chunks": s["lost_chunks"],
        "chunks_of_dead_workers": s["chunks_of_dead_workers"],
        "rejected": s["ingest"]["rejected"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.flaky_env", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--seeds", default="1,2,3", help="seeds, comma-separated (default: 1,2,3)")
    p.add_argument("--total-steps", type=int, default=250_000, help="budget (default: 250000)")
    p.add_argument("--target", type=float, default=400.0, help="eval bar (default: 400, RLlib's)")
    p.add_argument("--no-stop", action="store_true",
                   help="spend the whole budget (no stop at --target): env steps/s over equal "
                        "budgets, the crashes' cost in throughput alone")  # fmt: skip
    p.add_argument("--out", type=Path, help="results JSON (default: bench/results/flaky_env.json)")
    args = p.parse_args(argv)
    mark_start()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for arm, rates in ARMS.items():
                run = {"arm": arm, **one_run(rates, seed, args.total_steps, args.target,
                                             Path(tmp), stop=not args.no_stop)}  # fmt: skip
                runs.append(run)
                print(table([run], ["arm", "seed", "solved", "steps_to_target", "wall_to_target_s",
                                    "steps_per_s", "lost_chunks"]), flush=True)  # fmt: skip
    summary = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {
            "solved": sum(r["solved"] for r in mine), "runs": len(mine),
            "median_steps_to_target": median([r["steps_to_target"] or float("inf") for r in mine]),
            "median_steps_per_s": median([r["steps_per_s"] for r in mine]),
            "lost_chunks": sum(r["lost_chunks"] for r in mine),
            "env_errors": {k: sum(r["env_errors"][k] for r in mine) for k in mine[0]["env_errors"]},
        }  # fmt: skip
    ratio = (
        summary["crashes+stalls"]["median_steps_per_s"]
        / summary["stalls only"]["median_steps_per_s"]
    )
    result = {"seeds": seeds, "total_steps": args.total_steps, "target": args.target,
              "stopped_at_target": not args.no_stop,
              "rates": ARMS, "runs": runs, "summary": summary, "steps_per_s_ratio": ratio}  # fmt: skip
    path = write_results("flaky_env", result, args.out)
    print(table([{"arm": a, **s} for a, s in summary.items()],
                ["arm", "solved", "runs", "median_steps_to_target", "median_steps_per_s",
                 "lost_chunks", "env_errors"]))  # fmt: skip
    print(f"steps/s, crashes+stalls / stalls only: {ratio:.3f} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
