"""Learning curves: clusterenv against SB3 (DQN or SAC) on the same envs, seeds, budget and settings.

For each env and seed, `clusterenv train --algo ALGO --env ENV` (its shipped preset,
learner/tools/presets.toml; MinAtar's is MinAtar's reference DQN) runs as a subprocess, then SB3's
DQN or SAC with the same hyperparameters in SB3's units (bench/sb3_dqn.py; on MinAtar, MinAtar's
conv torso) runs in this process (torch.set_num_threads(1)). Both evaluate on one protocol: every
--eval-every env steps, --eval-episodes greedy episodes; return against env steps and wall time
(training and its evals). Every run spends its budget: no target stops it.

Runs take long (MinAtar at 500k env steps: ~17 min for clusterenv, ~32 min for SB3 on a 2-core
machine), so each finished run is its own file under --runs-dir and a later invocation skips the
runs it finds there: the benchmark can be run in parts, and the summary covers every run on disk.
Reported per env: each system's mean return (and the seeds' range) at the shared eval points; the
targets of issues 30 and 33: at equal env steps (and at the budget), clusterenv's mean within the
peer's range of seeds or above it, and clusterenv's wall time to the peer's final mean return at
most the peer's own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, mark_start, median, save_figure, table, write_results
from bench.sb3_dqn import Trial, sb3_params_from_preset, sb3_run, sb3_sac_params_from_preset
from bench.time_to_solve import clusterenv_run
from clusterenv.learner.tools.presets import defaults_for

ALGOS = ("dqn", "sac")
NEVER = 1e9  # a target no run reaches: every run spends its budget


def peer_of(algo: str) -> str:
    return f"SB3 {algo.upper()}"


def run_path(runs_dir: Path, system: str, env: str, seed: int) -> Path:
    return runs_dir / f"{system.replace(' ', '_')}__{env.replace('/', '_')}__s{seed}.json"


def sb3_params(algo: str, env: str, budget: int) -> dict[str, Any]:
    """SB3's arguments for clusterenv's preset of `env` (bench/sb3_dqn.py)."""
    return sb3_sac_params_from_preset(env) if algo == "sac" else sb3_params_from_preset(env, budget)


def run_one(
    algo: str,
    system: str,
    trial: Trial,
    seed: int,
    extra: list[str],
    max_wall: float,
    params: dict[str, Any],
) -> dict[str, Any]:
    """One run: clusterenv with `extra` flags, or SB3 with `params` (sb3_params)."""
    if system == "clusterenv":
        return clusterenv_run(seed, trial, ["--algo", algo, *extra], max_wall)
    return sb3_run(seed, trial, threads=1, params=params, algo=algo)


def curve(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean, min and max return over seeds at each eval's env steps (the evals every system
    asks at the same multiples of --eval-every; clusterenv's land a chunk or two later)."""
    points = min(len(r["evals"]) for r in runs)
    out = []
    for i in range(points):
        returns = [r["evals"][i][2] for r in runs]
        out.append({
            "env_steps": median([r["evals"][i][0] for r in runs]),
            "wall_s": median([r["evals"][i][1] for r in runs]),
            "mean": sum(returns) / len(returns), "min": min(returns), "max": max(returns),
        })  # fmt: skip
    return out


def wall_to(runs: list[dict[str, Any]], level: float) -> float:
    """Median over seeds of the wall time of the first eval at or above `level` (inf if none)."""
    return median([next((w for _, w, r in run["evals"] if r >= level), float("inf"))
                   for run in runs])  # fmt: skip


def summarize(by_system: dict[str, list[dict[str, Any]]], peer_name: str) -> dict[str, Any]:
    curves = {name: curve(runs) for name, runs in by_system.items() if runs}
    out: dict[str, Any] = {"curves": curves, "seeds": {n: len(r) for n, r in by_system.items()}}
    peer, ours = curves.get(peer_name), curves.get("clusterenv")
    if not (peer and ours):
        return out
    shared = min(len(peer), len(ours))
    # Within the peer's range of seeds, or above it.
    within = [c["mean"] >= p["min"] for p, c in zip(peer[:shared], ours[:shared], strict=True)]
    level = peer[-1]["mean"]  # the peer's final mean return
    peer_wall, our_wall = (
        wall_to(by_system[peer_name], level),
        wall_to(by_system["clusterenv"], level),
    )
    out |= {
        "evals_compared": shared,
        "evals_within_or_above_peer_range": sum(within),
        "final_within_or_above_peer_range": within[-1],
        "peer_final_mean": level,
        "wall_to_peer_final_s": {"clusterenv": our_wall, peer_name: peer_wall},
        "wall_ratio": our_wall / peer_wall if 0 < peer_wall < float("inf") else None,
    }
    return out


def plot(envs: dict[str, dict[str, Any]], path: Path) -> None:
    """Return against env steps (left) and wall time (right), one row per env: each system's
    mean over seeds, the seeds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(envs), 2, figsize=(10, 3.4 * len(envs)), squeeze=False)
    for row, (env, summary) in zip(axes, envs.items(), strict=True):
        for name, points in summary["curves"].items():
            for ax, x in zip(row, ("env_steps", "wall_s"), strict=True):
                xs = [p[x] for p in points]
                ax.plot(
                    xs,
                    [p["mean"] for p in points],
                    label=f"{name} ({summary['seeds'][name]} seeds)",
                )
                ax.fill_between(
                    xs, [p["min"] for p in points], [p["max"] for p in points], alpha=0.2
                )
        row[0].set_xlabel("env steps")
        row[1].set_xlabel("wall time (s)")
        for ax in row:
            ax.set_ylabel(f"{env}: greedy eval return")
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.learning_curves", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--algo",
        choices=ALGOS,
        default="dqn",
        help="both systems' algorithm: clusterenv's --algo against SB3's (default: dqn)",
    )
    p.add_argument(
        "--envs",
        default="MinAtar/Breakout-v1,MinAtar/SpaceInvaders-v1",
        help="comma-separated env ids, each with a preset for --algo "
        "(default: MinAtar/Breakout-v1,MinAtar/SpaceInvaders-v1)",
    )
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: 1,2,3)")
    p.add_argument(
        "--budget", type=int, default=500_000, help="env steps per run (default: 500000)"
    )
    p.add_argument(
        "--eval-every", type=int, default=25_000, help="env steps between evals (default: 25000)"
    )
    p.add_argument(
        "--eval-episodes", type=int, default=10, help="greedy episodes per eval (default: 10)"
    )
    p.add_argument(
        "--systems",
        default=None,
        help="which to run: clusterenv and/or SB3 DQN / SB3 SAC (default: both of --algo's)",
    )
    p.add_argument("--clusterenv-args", default="", help="extra `clusterenv train` flags")
    p.add_argument(
        "--max-wall",
        type=float,
        default=7200.0,
        help="seconds before a clusterenv run is stopped (default: 7200)",
    )
    p.add_argument(
        "--runs-dir",
        type=Path,
        default=RESULTS_DIR / "learning_curves",
        help="one file per finished run; runs found there are not run again "
        "(default: bench/results/learning_curves)",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        default=None,
        help="run at most this many missing runs, then summarize",
    )
    p.add_argument("--plot", type=Path, default=None, help="write the learning curves here")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="summary JSON (default: bench/results/learning_curves.json)",
    )
    args = p.parse_args(argv)  # fmt: skip
    known = ("clusterenv", peer_of(args.algo))
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    systems = [s.strip() for s in (args.systems or ",".join(known)).split(",") if s.strip()]
    if unknown := set(systems) - set(known):
        p.error(f"--systems: unknown {sorted(unknown)} with --algo {args.algo}; known: "
                f"{', '.join(known)}")  # fmt: skip
    try:  # a preset SB3 cannot express is refused now, not after the first run's hour
        params = {e: sb3_params(args.algo, e, args.budget) for e in envs}
    except ValueError as exc:
        p.error(f"--envs: {exc}")
    # Each env's preset env_kwargs go to both systems.
    trials = {e: Trial(e, defaults_for(e, args.algo, use_preset=True).env_kwargs, args.budget,
                       args.eval_every, args.eval_episodes, NEVER, 1) for e in envs}  # fmt: skip
    extra = args.clusterenv_args.split()
    mark_start()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    budget_left = args.max_runs
    for seed in seeds:  # seed-major, so a partial benchmark has whole pairs
        for env in envs:
            trial = trials[env]
            for system in systems:
                path = run_path(args.runs_dir, system, env, seed)
                if path.exists() or budget_left == 0:
                    continue
                run = run_one(args.algo, system, trial, seed, extra, args.max_wall, params[env])
                run |= {"trial": vars(trial) | {"target": None}, "loadavg_after": _load()}
                path.write_text(json.dumps(run, indent=1) + "\n")
                budget_left = None if budget_left is None else budget_left - 1
                final = run["evals"][-1] if run["evals"] else None
                print(
                    f"{env} seed {seed} {system}: final eval {final}, {run['wall_s']:.0f} s",
                    flush=True,
                )

    summaries, rows = {}, []
    for env in envs:
        by_system = {name: [json.loads(run_path(args.runs_dir, name, env, s).read_text())
                            for s in seeds if run_path(args.runs_dir, name, env, s).exists()]
                     for name in known}  # fmt: skip
        summaries[env] = s = summarize(by_system, peer_of(args.algo))
        for name, points in s["curves"].items():
            last = points[-1]
            rows.append({"env": env, "system": name, "seeds": s["seeds"][name],
                         "env steps": last["env_steps"], "final mean": last["mean"],
                         "final min": last["min"], "final max": last["max"],
                         "wall s": last["wall_s"],
                         "wall s to peer's final": s.get("wall_to_peer_final_s", {}).get(name)})  # fmt: skip
    if rows:
        print(table(rows, list(rows[0])))
    payload = {"args": vars(args) | {k: str(getattr(args, k)) for k in ("runs_dir", "plot", "out")},
               "sb3_params": {e: {k: v for k, v in ps.items() if k != "policy_kwargs"}
                              for e, ps in params.items()},
               "envs": summaries}  # fmt: skip
    path = write_results("learning_curves", payload, args.out)
    print(f"wrote {path}")
    if args.plot is not None and any(s["curves"] for s in summaries.values()):
        plot({g: s for g, s in summaries.items() if s["curves"]}, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _load() -> list[float]:
    import os

    return [round(x, 2) for x in os.getloadavg()]


if __name__ == "__main__":
    raise SystemExit(main())
