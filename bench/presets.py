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
    python -m bench.presets --sb3 --out bench/results/presets_sb3.json   # RL-Zoo's own SB3 DQN

With --sb3 the same envs, budgets and evaluation protocol run Stable-Baselines3 DQN in this
process with RL-Zoo's hyperparameters (hyperparams/dqn.yml; `pip install -e '.[bench]'`): whether
the bar is within reach of the settings the presets were mapped from, on this machine. Its rows
have no fresh episodes (SB3 keeps no best model here).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS_DIR, mark_start, median, table, train_run, write_results
from bench.sb3_dqn import RL_ZOO_CARTPOLE, Trial, hits, sb3_run
from bench.sync_summary import bootstrap_ci, bootstrap_ratio
from clusterenv.learner.tools.eval_checkpoint import greedy_episodes
from clusterenv.learner.tools.report import first_solve

# The bars: RL-Zoo's DQN results (LunarLander's is above RL-Zoo's 154).
BARS: dict[str, dict[str, float]] = {
    "CartPole-v1": {"bar": 500.0, "budget": 50_000},
    "Acrobot-v1": {"bar": -80.0, "budget": 100_000},
    "LunarLander-v3": {"bar": 200.0, "budget": 100_000},
    "MountainCar-v0": {"bar": -110.0, "budget": 120_000},
}


# RL-Zoo hyperparams/dqn.yml (LunarLander-v2's entry for v3); CartPole-v1's is bench.sb3_dqn's.
_ZOO_ACROBOT_LUNARLANDER = {
    "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000, "learning_starts": 0,
    "gamma": 0.99, "target_update_interval": 250, "train_freq": 4, "gradient_steps": -1,
    "exploration_fraction": 0.12, "exploration_final_eps": 0.1,
    "policy_kwargs": {"net_arch": [256, 256]},
}  # fmt: skip
RL_ZOO: dict[str, dict[str, Any]] = {
    "CartPole-v1": RL_ZOO_CARTPOLE,
    "Acrobot-v1": _ZOO_ACROBOT_LUNARLANDER,
    "LunarLander-v3": _ZOO_ACROBOT_LUNARLANDER,
    "MountainCar-v0": {
        "learning_rate": 4e-3, "batch_size": 128, "buffer_size": 10_000, "learning_starts": 1000,
        "gamma": 0.98, "target_update_interval": 600, "train_freq": 16, "gradient_steps": 8,
        "exploration_fraction": 0.2, "exploration_final_eps": 0.07,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
}  # fmt: skip

# Seeds of the fresh episodes: small numbers, far below the runs' own evaluation seeds
# (clusterenv.pipeline.chunks.actor.eval_seeds), so no episode repeats one the run was scored on.
FRESH_SEED = 1_000


def run_one(
    env: str, seed: int, runs_dir: Path, fresh_episodes: int, variant: str = ""
) -> dict[str, Any]:
    """The preset's run, with a variant's flags added (`variant`: flags as one string)."""
    spec = BARS[env]
    flags = ["--env", env, "--seed", str(seed), "--total-steps", str(spec["budget"]), "--target-return", "1e9"]  # fmt: skip
    return result(
        env, seed, train_run(flags + variant.split(), runs_dir, "preset-"), fresh_episodes
    )


def sb3_one(env: str, seed: int) -> dict[str, Any]:
    """SB3 DQN with RL-Zoo's settings over the bar's budget: the same row, without fresh episodes."""
    spec = BARS[env]
    trial = Trial(env, {}, spec["budget"], 2_000, 10, float("inf"), 1)
    run = sb3_run(seed, trial, threads=1, params=RL_ZOO[env])
    first, _ = hits(run["evals"], spec["bar"], 1)
    evals = [(steps, mean) for steps, _, mean in run["evals"]]
    best_steps, best = max(evals, key=lambda e: e[1])
    return {
        "env": env, "seed": seed, "system": "SB3 DQN", "bar": spec["bar"], "budget": spec["budget"],
        "first_hit_steps": first[0] if first else None, "end_eval": evals[-1][1], "end_eval_steps": evals[-1][0],
        "mean_eval": sum(mean for _, mean in evals) / len(evals), "best_eval": best, "best_eval_steps": best_steps, "wall_s": run["wall_s"],
    }  # fmt: skip


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
        "env": env, "seed": seed, "system": "clusterenv", "bar": spec["bar"], "budget": spec["budget"],
        "first_hit_steps": first, "end_eval": evals[-1], "end_eval_steps": run["rows"][-1]["env_steps"],
        "mean_eval": sum(evals) / len(evals), "best_eval": max(evals), "best_eval_steps": run["summary"]["best"]["env_steps"],
        "fresh_episodes": fresh_episodes, "final_fresh": fresh["final"], "best_fresh": fresh["best"],
        "wall_s": run["summary"]["wall_s"], "run_dir": str(run["dir"]),
    }  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per env and system: how many runs reached the bar and held it; the median env steps to the
    first hit (a run that missed counts as never: +inf) and the mean eval over the budget, with
    bootstrap 95 % intervals over seeds; against the env's first system (the preset as it ships,
    where variants ran), the ratio of median first hits with its interval."""
    out = []
    bases: dict[str, tuple[str, list[float]]] = {}
    for env, system in dict.fromkeys((r["env"], r["system"]) for r in runs):
        mine = [r for r in runs if r["env"] == env and r["system"] == system]
        bar = mine[0]["bar"]
        steps = [math.inf if r["first_hit_steps"] is None else r["first_hit_steps"] for r in mine]
        # The env's first system (the preset as it ships) is what its variants compare to.
        base_system, base_steps = bases.setdefault(env, (system, steps))
        ratio = None if system == base_system else bootstrap_ratio(steps, base_steps)
        # Rows of before 2026-12-07 lack mean_eval.
        means = [r["mean_eval"] for r in mine if "mean_eval" in r]
        fresh = [r["best_fresh"] for r in mine if "best_fresh" in r]
        out.append({
            "env": env, "system": system, "bar": bar, "budget": mine[0]["budget"], "seeds": len(mine),
            "reached_bar": f"{sum(s != math.inf for s in steps)}/{len(mine)}",
            "median_first_hit": median(steps), "first_hit_ci": bootstrap_ci(steps, np.median),
            "first_hit_vs_first_system": ratio,
            "above_bar_at_end": f"{sum(r['end_eval'] >= bar for r in mine)}/{len(mine)}",
            "median_end_eval": median([r["end_eval"] for r in mine]),
            "mean_eval": sum(means) / len(means) if means else None,
            "mean_eval_ci": bootstrap_ci(means, np.mean) if means else None,
            "median_best_eval": median([r["best_eval"] for r in mine]),
            "best_fresh_above_bar": f"{sum(f >= bar for f in fresh)}/{len(fresh)}" if fresh else None,
            "median_best_fresh": median(fresh) if fresh else None,
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=",".join(BARS), help="comma-separated env ids")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "presets.json")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/bench-presets"))
    p.add_argument("--resume", action="store_true", help="keep runs already in --out")
    p.add_argument("--sb3", action="store_true", help="run SB3 DQN with RL-Zoo's settings instead")
    p.add_argument(
        "--fresh-episodes",
        type=int,
        default=30,
        help="episodes of final.safetensors and best.safetensors after each run",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="train flags added to the preset (repeatable; each seed runs the preset, "
        "then each variant), e.g. --variant='--lr-end 0'",
    )
    p.add_argument(
        "--base",
        default="",
        help="train flags added to every clusterenv run, the preset's too, and left out of the "
        "systems' names: to resume an ablation against a preset as it was before it changed",
    )
    args = p.parse_args(argv)
    mark_start()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    if args.resume and args.out.exists():
        runs = json.loads(args.out.read_text())["runs"]
    if args.sb3 and (args.variant or args.base):
        p.error("--variant and --base apply to clusterenv runs, not --sb3")
    done = {(r["env"], r["seed"], r["system"]) for r in runs}
    for env in args.envs.split(","):
        if env not in BARS:
            p.error(f"--envs: no bar for {env!r}; known: {', '.join(BARS)}")
        for seed, variant in (
            (int(s), v) for s in args.seeds.split(",") for v in ["", *args.variant]
        ):
            system = "SB3 DQN" if args.sb3 else f"clusterenv {variant}".strip()
            if (env, seed, system) in done:
                continue
            if args.sb3:
                r = sb3_one(env, seed)
            else:
                r = run_one(env, seed, args.runs_dir, args.fresh_episodes,
                            f"{args.base} {variant}".strip())  # fmt: skip
            r["system"] = system
            if args.base:
                r["base"] = args.base
            runs.append(r)
            fresh = (f", fresh: final {r['final_fresh']:.1f}, best {r['best_fresh']:.1f}"
                     if "best_fresh" in r else "")  # fmt: skip
            print(f"{env} seed {seed} ({r['system']}): first >= {r['bar']} at {r['first_hit_steps']}, "
                  f"end {r['end_eval']:.1f}, best {r['best_eval']:.1f}{fresh}; {r['wall_s']:.0f} s", flush=True)  # fmt: skip
            write_results("presets", {"runs": runs, "summary": summarise(runs)}, args.out)
    cols = ["env", "seed", "system", "first_hit_steps", "end_eval", "end_eval_steps", "best_eval",
            "best_eval_steps", *(["final_fresh", "best_fresh"] if not args.sb3 else []), "wall_s"]  # fmt: skip
    print(table(runs, cols))
    print()
    summary = summarise(runs)
    print(table(summary, list(summary[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
