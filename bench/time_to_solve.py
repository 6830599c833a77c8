"""Time to solve: clusterenv versus Stable-Baselines3 DQN, same env, seeds and machine.

For each seed, `clusterenv train --seed S` runs as a subprocess with default flags (and each
--variant), then SB3 DQN with the RL-Zoo CartPole-v1 hyperparameters runs in this process
(torch.set_num_threads(1)). Both use one eval protocol on the same env: every 2,000 env steps,
10 greedy episodes (one in each of 10 envs). Two figures per run: the first eval with mean >= 475
("first hit"), and the first of --solve-evals consecutive such evals ("confirmed", robust to one
lucky eval); a run stops at its confirmed hit. Wall time counts training and its evals (SB3: from
the start of `learn`; clusterenv: the learner's clock, plus the whole process as a third figure).
`--env bench.envs:SlowCartPole-v1 --env-kwargs '{"delay_s": 0.004}'` is the expensive env: CartPole
plus a 4 ms sleep per step, evaluated on that env by both systems. Issue 30's expensive pixel env is
`--env bench.envs:MinAtar/SlowBreakout-v1 --env-kwargs '{"delay_s": 0.002}' --sb3-params preset`:
both systems then run clusterenv's MinAtar preset (MinAtar's reference DQN and conv torso).
`--algo sac --env Pendulum-v1 --target -200` (issue 33) is clusterenv's SAC against SB3's SAC, both
with clusterenv's SAC preset of the env (RL-Zoo's settings, in SB3's units for SB3).
SB3 is the optional bench dependency: pip install -e '.[bench]'.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import TRAIN, mark_start, median, save_figure, table, write_results
from bench.sb3_dqn import (
    RL_ZOO_CARTPOLE,
    Trial,
    hits,
    sb3_params_from_preset,
    sb3_run,
    sb3_sac_params_from_preset,
)


def clusterenv_run(
    seed: int,
    trial: Trial,
    extra: list[str],
    max_wall_s: float,
) -> dict[str, Any]:
    """One `clusterenv train` subprocess; wall time and env steps at its first eval >= target.

    A run still going after `max_wall_s` gets SIGTERM (the CLI stops its workers and server) and
    counts as not solved, with the evals it logged so far.
    """
    with tempfile.TemporaryDirectory(prefix="bench-tts-") as tmp:
        cmd = [
            *TRAIN,
            "--seed",
            str(seed),
            "--run-dir",
            tmp,
            "--total-steps",
            str(trial.budget),
            "--eval-every",
            str(trial.eval_every),
            "--eval-episodes",
            str(trial.episodes),
            "--target-return",
            str(trial.target),
            "--solve-evals",
            str(trial.solve_evals),
            "--env",
            trial.env,
            "--env-kwargs",
            json.dumps(trial.env_kwargs),
            *extra,
        ]
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            try:
                proc.wait(timeout=max_wall_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
                timed_out = True
            process_wall = time.perf_counter() - t0
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if proc.returncode != 0 and not timed_out:
            raise RuntimeError(f"clusterenv train failed ({proc.returncode}): {stderr[-2000:]}")
        (run_dir,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    triples = [(r["env_steps"], r["wall_s"], r["eval/return_mean"]) for r in evals]
    first, confirmed = hits(triples, trial.target, trial.solve_evals)
    last = evals[-1] if evals else {"env_steps": 0, "wall_s": process_wall, "learner/updates": 0}
    # The metrics row of the confirmed hit (or the last one), for the update count.
    at = next((r for r in evals if confirmed and r["env_steps"] == confirmed[0]), None)
    return {
        "seed": seed,
        "solved": confirmed is not None,
        "first_hit": first,
        "timed_out": timed_out,
        "env_steps": confirmed[0]
        if confirmed
        else (last["env_steps"] if timed_out else summary["env_steps"]),
        "wall_s": confirmed[1]
        if confirmed
        else (last["wall_s"] if timed_out else summary["wall_s"]),
        "process_wall_s": round(process_wall, 3),
        "updates": (at or last)["learner/updates"] if at or timed_out else summary["updates"],
        "evals": triples,
        "ingest_cpu_fraction": summary.get("ingest_cpu_fraction"),
        "eval_latency_s_median": float(np.median([r.get("eval/latency_s", 0) for r in evals]))
        if evals
        else None,
    }


def _solve_figures(runs: list[dict[str, Any]]) -> tuple[float, float, float, float]:
    """Median wall and env steps of the confirmed hit, then of the first hit; a run that did not
    get there counts as infinitely slow."""
    inf = float("inf")
    return (
        median([r["wall_s"] if r["solved"] else inf for r in runs]),
        median([r["env_steps"] if r["solved"] else inf for r in runs]),
        median([r["first_hit"][1] if r["first_hit"] else inf for r in runs]),
        median([r["first_hit"][0] if r["first_hit"] else inf for r in runs]),
    )


def workers_of(flags: list[str]) -> int:
    """The local worker count a clusterenv system ran with (train's default: one per core)."""
    found = re.findall(r"--workers[= ](\d+)", " ".join(flags))
    return int(found[-1]) if found else (os.cpu_count() or 1)


def plot_vs_workers(
    systems: dict[str, list[str]], summary: dict[str, Any], path: Path, peer: str = "SB3 DQN"
) -> None:
    """Median confirmed wall time against local workers, SB3 (one process) as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted(
        (workers_of(flags), summary[name]["median_wall_s"]) for name, flags in systems.items()
    )
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([w for w, _ in points], [t for _, t in points], "o-", label="clusterenv (median)")
    sb3 = summary.get(peer, {}).get("median_wall_s")
    if sb3 is not None:
        ax.axhline(sb3, color="tab:red", ls="--", label=f"{peer}, one process (median)")
        ax.axhline(0.25 * sb3, color="tab:red", ls=":", alpha=0.6, label="0.25 x SB3")
    ax.set_xscale("log", base=2)
    ax.set_xticks([w for w, _ in points], [str(w) for w, _ in points])
    ax.set_xlabel("local worker processes")
    ax.set_ylabel("wall time to the target return (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.time_to_solve", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: 1,2,3)")
    p.add_argument("--env", default="CartPole-v1", help="env id for both systems")
    p.add_argument(
        "--env-kwargs", type=json.loads, default={}, help="JSON keyword arguments of the env"
    )
    p.add_argument(
        "--solve-evals",
        type=int,
        default=2,
        help="consecutive evals >= target that count as solved and stop a run (default: 2)",
    )
    p.add_argument(
        "--target-ratio",
        type=float,
        default=0.5,
        help="wall / SB3 wall that the median must reach (default: 0.5)",
    )
    p.add_argument("--plot", type=Path, default=None, help="write wall time vs workers here")
    p.add_argument(
        "--budget", type=int, default=100_000, help="env-step budget of each run (default: 100000)"
    )
    p.add_argument(
        "--target", type=float, default=475.0, help="greedy eval mean that counts as solved"
    )
    p.add_argument(
        "--eval-every", type=int, default=2000, help="env steps between evals (default: 2000)"
    )
    p.add_argument("--eval-episodes", type=int, default=10, help="episodes per eval (default: 10)")
    p.add_argument("--sb3-threads", type=int, default=1, help="torch threads for SB3 (default: 1)")
    p.add_argument(
        "--sb3-params",
        choices=("rl-zoo-cartpole", "preset"),
        default="rl-zoo-cartpole",
        help="SB3's hyperparameters: RL-Zoo's CartPole-v1 ones, or clusterenv's preset of --env "
        "in SB3's units (default: rl-zoo-cartpole; --algo sac always takes the preset)",
    )
    p.add_argument(
        "--algo",
        choices=("dqn", "sac"),
        default="dqn",
        help="both systems' algorithm: DQN, or SAC (clusterenv's --algo sac against SB3's SAC)",
    )
    p.add_argument(
        "--clusterenv-args", default="", help="extra `clusterenv train` flags, e.g. '--workers 1'"
    )
    p.add_argument(
        "--max-wall",
        type=float,
        default=600.0,
        help="seconds after which a clusterenv run is stopped and counts as not solved "
        "(default: 600)",
    )
    p.add_argument("--skip-sb3", action="store_true", help="run clusterenv only (no ratio then)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="FLAGS",
        help="also run clusterenv with these extra flags per seed, reported as its own "
        "system, e.g. --variant='--chunk-steps 128' (repeatable)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default: bench/results/time_to_solve.json)",
    )
    args = p.parse_args(argv)
    mark_start()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    trial = Trial(
        args.env, args.env_kwargs, args.budget, args.eval_every, args.eval_episodes, args.target,
        args.solve_evals,
    )  # fmt: skip
    systems = {"clusterenv": args.clusterenv_args.split()}
    systems |= {
        f"clusterenv {v}": [*args.clusterenv_args.split(), *v.split()] for v in args.variant
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    sb3_params = (
        sb3_sac_params_from_preset(args.env)
        if args.algo == "sac"
        else sb3_params_from_preset(args.env, args.budget)
        if args.sb3_params == "preset"
        else None
    )
    for flags in systems.values():
        flags[:0] = ["--algo", args.algo]
    peer = f"SB3 {args.algo.upper()}"
    if not args.skip_sb3:
        results[peer] = []
    for seed in seeds:  # interleaved, so a change in machine load hits every system
        for name, extra in systems.items():
            results[name].append(clusterenv_run(seed, trial, extra=extra, max_wall_s=args.max_wall))
            print(f"seed {seed} {name}: {_fmt_run(results[name][-1])}", flush=True)
        if not args.skip_sb3:
            sb3 = sb3_run(seed, trial, threads=args.sb3_threads, params=sb3_params, algo=args.algo)
            results[peer].append(sb3)
            print(f"seed {seed} {peer}: {_fmt_run(results[peer][-1])}", flush=True)

    rows = [
        {
            "system": name,
            "seed": r["seed"],
            "solved": "yes" if r["solved"] else ("NO, timed out" if r.get("timed_out") else "NO"),
            "first hit steps": r["first_hit"][0] if r["first_hit"] else None,
            "first hit s": r["first_hit"][1] if r["first_hit"] else None,
            "env steps": r["env_steps"],
            "wall s": r["wall_s"],
            "updates": r["updates"],
            "updates/s": r["updates"] / r["wall_s"] if r["wall_s"] else None,
            "process wall s": r.get("process_wall_s"),
        }
        for name, runs in results.items()
        for r in runs
    ]
    sb_wall = _solve_figures(results[peer])[0] if not args.skip_sb3 else float("nan")
    summary: dict[str, Any] = {}
    medians = []
    sb_first = _solve_figures(results[peer])[2] if not args.skip_sb3 else float("nan")
    goal = args.target_ratio
    for name, runs in results.items():
        wall, steps, first_wall, first_steps = _solve_figures(runs)
        ratio = wall / sb_wall if name != peer and 0 < sb_wall < float("inf") else None
        first_ratio = (
            first_wall / sb_first if name != peer and 0 < sb_first < float("inf") else None
        )
        summary[name] = {
            "median_wall_s": wall,
            "median_env_steps": steps,
            "median_first_hit_wall_s": first_wall,
            "median_first_hit_env_steps": first_steps,
            "wall_ratio_to_sb3": ratio,
            "first_hit_wall_ratio_to_sb3": first_ratio,
            "target_met": ratio is not None and ratio <= goal,
        }
        medians.append(
            {
                "system": name,
                "median s (confirmed)": wall,
                "median steps (confirmed)": steps,
                "median s (first hit)": first_wall,
                "median steps (first hit)": first_steps,
                "/ SB3 (confirmed)": ratio,
                "/ SB3 (first hit)": first_ratio,
                f"≤{goal:g}": "-"
                if name == peer
                else ("yes" if ratio is not None and ratio <= goal else "NO"),
            }
        )
    print()
    print(table(rows, list(rows[0])))
    print()
    print(table(medians, list(medians[0])))
    clean = {
        n: {k: (None if v == float("inf") else v) for k, v in d.items()} for n, d in summary.items()
    }
    payload = {
        "args": vars(args) | {"out": str(args.out), "plot": str(args.plot)},
        "sb3_hyperparameters": RL_ZOO_CARTPOLE if sb3_params is None else sb3_params,
        "summary": clean,
        "runs": results,
    }
    path = write_results("time_to_solve", payload, args.out)
    print(f"\nwrote {path}")
    if args.plot is not None:
        plot_vs_workers(systems, clean, args.plot, peer)
        print(f"wrote {args.plot}")
    return 0


def _fmt_run(r: dict[str, Any]) -> str:
    state = (
        "solved"
        if r["solved"]
        else "NOT solved" + (" (stopped at --max-wall)" if r.get("timed_out") else "")
    )
    return f"{state} at {r['env_steps']} env steps, {r['wall_s']:.1f} s, {r['updates']} updates"


if __name__ == "__main__":
    raise SystemExit(main())
