"""Time to solve CartPole-v1: clusterenv versus Stable-Baselines3 DQN, same seeds, same machine.

For each seed, `clusterenv train --seed S` runs as a subprocess with default flags, then SB3 DQN
with the RL-Zoo CartPole-v1 hyperparameters runs in this process (torch.set_num_threads(1)). Both
use one eval protocol: every 2,000 env steps, 10 greedy episodes (one in each of 10 envs), and
solved once the mean is >= 475. Wall time counts training and its evals (SB3: from the start of
`learn`; clusterenv: the learner's clock, plus the whole process as a second figure).
SB3 is the optional bench dependency: pip install -e '.[bench]'.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import mark_start, median, table, write_results

# RL-Zoo hyperparams/dqn.yml, CartPole-v1 (n_timesteps there is 5e4; the budget here is a flag).
RL_ZOO_CARTPOLE = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
ENV = "CartPole-v1"


def clusterenv_run(
    seed: int,
    budget: int,
    eval_every: int,
    episodes: int,
    target: float,
    extra: list[str],
    max_wall_s: float,
) -> dict[str, Any]:
    """One `clusterenv train` subprocess; wall time and env steps at its first eval >= target.

    A run still going after `max_wall_s` gets SIGTERM (the CLI stops its workers and server) and
    counts as not solved, with the evals it logged so far.
    """
    with tempfile.TemporaryDirectory(prefix="bench-tts-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "learner.cli",
            "train",
            "--seed",
            str(seed),
            "--run-dir",
            tmp,
            "--total-steps",
            str(budget),
            "--eval-every",
            str(eval_every),
            "--eval-episodes",
            str(episodes),
            "--target-return",
            str(target),
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
    hit = next((r for r in evals if r["eval/return_mean"] >= target), None)
    last = evals[-1] if evals else {"env_steps": 0, "wall_s": process_wall, "learner/updates": 0}
    return {
        "seed": seed,
        "solved": hit is not None,
        "timed_out": timed_out,
        "env_steps": (hit or last)["env_steps"] if hit or timed_out else summary["env_steps"],
        "wall_s": (hit or last)["wall_s"] if hit or timed_out else summary["wall_s"],
        "process_wall_s": round(process_wall, 3),
        "updates": (hit or last)["learner/updates"] if hit or timed_out else summary["updates"],
        "evals": [(r["env_steps"], r["wall_s"], r["eval/return_mean"]) for r in evals],
        "ingest_cpu_fraction": summary.get("ingest_cpu_fraction"),
    }


def sb3_run(
    seed: int, budget: int, eval_every: int, episodes: int, target: float, threads: int
) -> dict[str, Any]:
    """SB3 DQN with the RL-Zoo settings, stopped at the first eval whose mean is >= target."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(threads)

    class SolveCallback(BaseCallback):
        """EvalCallback's protocol, but stopping at the first mean >= target and timing it."""

        def __init__(self) -> None:
            super().__init__()
            self.eval_env = make_vec_env(ENV, n_envs=episodes, seed=seed + 10**6)
            self.evals: list[tuple[int, float, float]] = []
            self.t0 = 0.0

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every:
                return True
            returns, _ = evaluate_policy(
                self.model,
                self.eval_env,
                n_eval_episodes=episodes,
                deterministic=True,
                return_episode_rewards=True,
            )
            mean = float(sum(returns) / len(returns))
            self.evals.append((self.num_timesteps, round(time.perf_counter() - self.t0, 3), mean))
            return mean < target

    env = make_vec_env(ENV, n_envs=1, seed=seed)
    model = DQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **RL_ZOO_CARTPOLE)
    cb = SolveCallback()
    cb.t0 = time.perf_counter()
    model.learn(total_timesteps=budget, callback=cb)
    wall = time.perf_counter() - cb.t0
    env.close()
    cb.eval_env.close()
    hit = next((e for e in cb.evals if e[2] >= target), None)
    return {
        "seed": seed,
        "solved": hit is not None,
        "env_steps": hit[0] if hit else model.num_timesteps,
        "wall_s": hit[1] if hit else round(wall, 3),
        "updates": int(model._n_updates),
        "evals": cb.evals,
    }


def _solve_figures(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Median wall and env steps; a run that did not solve counts as infinitely slow."""
    inf = float("inf")
    return (
        median([r["wall_s"] if r["solved"] else inf for r in runs]),
        median([r["env_steps"] if r["solved"] else inf for r in runs]),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.time_to_solve", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: 1,2,3)")
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
    common = dict(
        budget=args.budget,
        eval_every=args.eval_every,
        episodes=args.eval_episodes,
        target=args.target,
    )
    systems = {"clusterenv": args.clusterenv_args.split()}
    systems |= {
        f"clusterenv {v}": [*args.clusterenv_args.split(), *v.split()] for v in args.variant
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    if not args.skip_sb3:
        results["SB3 DQN"] = []
    for seed in seeds:  # interleaved, so a change in machine load hits every system
        for name, extra in systems.items():
            results[name].append(
                clusterenv_run(seed, **common, extra=extra, max_wall_s=args.max_wall)
            )
            print(f"seed {seed} {name}: {_fmt_run(results[name][-1])}", flush=True)
        if not args.skip_sb3:
            results["SB3 DQN"].append(sb3_run(seed, **common, threads=args.sb3_threads))
            print(f"seed {seed} SB3 DQN: {_fmt_run(results['SB3 DQN'][-1])}", flush=True)

    rows = [
        {
            "system": name,
            "seed": r["seed"],
            "solved": "yes" if r["solved"] else ("NO, timed out" if r.get("timed_out") else "NO"),
            "env steps": r["env_steps"],
            "wall s": r["wall_s"],
            "updates": r["updates"],
            "updates/s": r["updates"] / r["wall_s"] if r["wall_s"] else None,
            "process wall s": r.get("process_wall_s"),
        }
        for name, runs in results.items()
        for r in runs
    ]
    sb_wall = _solve_figures(results["SB3 DQN"])[0] if not args.skip_sb3 else float("nan")
    summary: dict[str, Any] = {}
    medians = []
    for name, runs in results.items():
        wall, steps = _solve_figures(runs)
        ratio = wall / sb_wall if name != "SB3 DQN" and 0 < sb_wall < float("inf") else None
        summary[name] = {
            "median_wall_s": wall,
            "median_env_steps": steps,
            "wall_ratio_to_sb3": ratio,
            "target_met": ratio is not None and ratio <= 0.5,
        }
        medians.append(
            {
                "system": name,
                "median wall s": wall,
                "median env steps": steps,
                "wall / SB3 wall": ratio,
                "≤0.5": "-"
                if name == "SB3 DQN"
                else ("yes" if ratio is not None and ratio <= 0.5 else "NO"),
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
        "args": vars(args) | {"out": str(args.out)},
        "rl_zoo_hyperparameters": RL_ZOO_CARTPOLE,
        "summary": clean,
        "runs": results,
    }
    path = write_results("time_to_solve", payload, args.out)
    print(f"\nwrote {path}")
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
