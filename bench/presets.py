"""Per-env presets against RL-Zoo's DQN figures: `clusterenv train --env ENV` with nothing else.

For each env and seed, `clusterenv train --env ENV --seed S` runs with its preset
(learner/presets.toml) and default evaluation (10 greedy episodes every 2,000 env steps). Two
flags set only the measurement window: `--total-steps` (the bar's budget) and `--target-return
1e9` (no early stop, so the eval at the end of the budget exists). Per run: the first eval at or
above the bar, the eval at the end of the budget, the best eval; and, on `--fresh-episodes`
episodes of seeds no evaluation of the run used, the greedy return of the two networks the run
leaves: final.safetensors (the network at the end of the budget) and best.safetensors (the
network of the best eval; its own eval is a maximum over evals, so biased upward, which the fresh
episodes are not). Results are appended run by run (resumable with --resume).

    python -m bench.presets                                  # 4 envs x 3 seeds (about an hour)
    python -m bench.presets --envs LunarLander-v3 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, mark_start, median, table, train_run, write_results
from clusterenv.learner.eval_checkpoint import greedy_episodes
from clusterenv.learner.report import first_solve

# The bars: RL-Zoo's DQN results (LunarLander's is above RL-Zoo's 154).
BARS: dict[str, dict[str, float]] = {
    "CartPole-v1": {"bar": 500.0, "budget": 50_000},
    "Acrobot-v1": {"bar": -80.0, "budget": 100_000},
    "LunarLander-v3": {"bar": 200.0, "budget": 100_000},
    "MountainCar-v0": {"bar": -110.0, "budget": 120_000},
}


# Seeds of the fresh episodes: small numbers, far below the runs' own evaluation seeds
# (clusterenv.pipeline.chunks.actor.eval_seeds), so no episode repeats one the run was scored on.
FRESH_SEED = 1_000


def run_one(env: str, seed: int, runs_dir: Path, fresh_episodes: int) -> dict[str, Any]:
    spec = BARS[env]
    flags = ["--env", env, "--seed", str(seed), "--total-steps", str(spec["budget"]), "--target-return", "1e9"]  # fmt: skip
    return result(env, seed, train_run(flags, runs_dir, "preset-"), fresh_episodes)


def result(env: str, seed: int, run: dict[str, Any], fresh_episodes: int) -> dict[str, Any]:
    """One run's row: first eval at the bar, the eval at the end of the budget, the best eval,
    and fresh episodes of final.safetensors and best.safetensors."""
    spec = BARS[env]
    evals = [r["eval/return_mean"] for r in run["rows"]]
    first, _ = first_solve(run, spec["bar"])
    fresh = {
        name: float(greedy_episodes(run["dir"] / f"{name}.safetensors", fresh_episodes, FRESH_SEED)[0].mean())
        for name in ("final", "best")
    }  # fmt: skip
    return {
        "env": env, "seed": seed, "bar": spec["bar"], "budget": spec["budget"],
        "first_hit_steps": first, "end_eval": evals[-1], "end_eval_steps": run["rows"][-1]["env_steps"],
        "best_eval": max(evals), "best_eval_steps": run["summary"]["best"]["env_steps"],
        "fresh_episodes": fresh_episodes, "final_fresh": fresh["final"], "best_fresh": fresh["best"],
        "wall_s": run["summary"]["wall_s"], "run_dir": str(run["dir"]),
    }  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for env in dict.fromkeys(r["env"] for r in runs):
        mine = [r for r in runs if r["env"] == env]
        bar = mine[0]["bar"]
        hits = [r["first_hit_steps"] for r in mine if r["first_hit_steps"] is not None]
        out.append({
            "env": env, "bar": bar, "budget": mine[0]["budget"], "seeds": len(mine),
            "reached_bar": f"{len(hits)}/{len(mine)}",
            "median_first_hit": median(hits) if len(hits) == len(mine) else None,
            "above_bar_at_end": f"{sum(r['end_eval'] >= bar for r in mine)}/{len(mine)}",
            "median_end_eval": median([r["end_eval"] for r in mine]),
            "median_best_eval": median([r["best_eval"] for r in mine]),
            "best_fresh_above_bar": f"{sum(r['best_fresh'] >= bar for r in mine)}/{len(mine)}",
            "median_best_fresh": median([r["best_fresh"] for r in mine]),
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=",".join(BARS), help="comma-separated env ids")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "presets.json")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/bench-presets"))
    p.add_argument("--resume", action="store_true", help="keep runs already in --out")
    p.add_argument("--fresh-episodes", type=int, default=30,
                   help="episodes of final.safetensors and best.safetensors after each run")  # fmt: skip
    args = p.parse_args(argv)
    mark_start()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    if args.resume and args.out.exists():
        runs = json.loads(args.out.read_text())["runs"]
    done = {(r["env"], r["seed"]) for r in runs}
    for env in args.envs.split(","):
        if env not in BARS:
            p.error(f"--envs: no bar for {env!r}; known: {', '.join(BARS)}")
        for seed in (int(s) for s in args.seeds.split(",")):
            if (env, seed) in done:
                continue
            r = run_one(env, seed, args.runs_dir, args.fresh_episodes)
            runs.append(r)
            print(f"{env} seed {seed}: first >= {r['bar']} at {r['first_hit_steps']}, "
                  f"end {r['end_eval']:.1f}, best {r['best_eval']:.1f}, fresh: final "
                  f"{r['final_fresh']:.1f}, best {r['best_fresh']:.1f}; {r['wall_s']:.0f} s", flush=True)  # fmt: skip
            write_results("presets", {"runs": runs, "summary": summarise(runs)}, args.out)
    cols = ["env", "seed", "first_hit_steps", "end_eval", "end_eval_steps", "best_eval",
            "best_eval_steps", "final_fresh", "best_fresh", "wall_s"]  # fmt: skip
    print(table(runs, cols))
    print()
    summary = summarise(runs)
    print(table(summary, list(summary[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
