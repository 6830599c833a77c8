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
    seed: int, budget: int, eval_every: int, episodes: int, target: float, extra: list[str]
) -> dict[str, Any]:
    """One `clusterenv train` subprocess; wall time and env steps at its first eval >= target."""
    with tempfile.TemporaryDirectory(prefix="bench-tts-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pipeline.cli",
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
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        process_wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(
                f"clusterenv train failed ({proc.returncode}): {proc.stderr[-2000:]}"
            )
        (run_dir,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        summary = json.loads((run_dir / "summary.json").read_text())
        evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    hit = next((r for r in evals if r["eval/return_mean"] >= target), None)
    return {
        "seed": seed,
        "solved": hit is not None,
        "env_steps": hit["env_steps"] if hit else summary["env_steps"],
        "wall_s": hit["wall_s"] if hit else summary["wall_s"],
        "process_wall_s": round(process_wall, 3),
        "updates": hit["learner/updates"] if hit else summary["updates"],
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
    p.add_argument("--skip-sb3", action="store_true", help="run clusterenv only (no ratio then)")
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

    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for seed in seeds:  # interleaved, so a change in machine load hits both
        ours.append(clusterenv_run(seed, **common, extra=args.clusterenv_args.split()))
        print(f"seed {seed} clusterenv: {_fmt_run(ours[-1])}", flush=True)
        if not args.skip_sb3:
            theirs.append(sb3_run(seed, **common, threads=args.sb3_threads))
            print(f"seed {seed} SB3 DQN:    {_fmt_run(theirs[-1])}", flush=True)

    rows = []
    for name, runs in (("clusterenv", ours), ("SB3 DQN", theirs)):
        for r in runs:
            rows.append(
                {
                    "system": name,
                    "seed": r["seed"],
                    "solved": "yes" if r["solved"] else "NO",
                    "env steps": r["env_steps"],
                    "wall s": r["wall_s"],
                    "updates": r["updates"],
                    "process wall s": r.get("process_wall_s"),
                }
            )
    ce_wall, ce_steps = _solve_figures(ours)
    summary: dict[str, Any] = {
        "clusterenv_median_wall_s": ce_wall,
        "clusterenv_median_env_steps": ce_steps,
    }
    medians = [{"system": "clusterenv", "median wall s": ce_wall, "median env steps": ce_steps}]
    if theirs:
        sb_wall, sb_steps = _solve_figures(theirs)
        ratio = ce_wall / sb_wall if sb_wall not in (0, float("inf")) else float("nan")
        summary |= {
            "sb3_median_wall_s": sb_wall,
            "sb3_median_env_steps": sb_steps,
            "wall_ratio": ratio,
            "target_met": ratio <= 0.5,
        }
        medians.append(
            {"system": "SB3 DQN", "median wall s": sb_wall, "median env steps": sb_steps}
        )
    print()
    print(table(rows, list(rows[0])))
    print()
    print(table(medians, ["system", "median wall s", "median env steps"]))
    if theirs:
        print(
            f"\nclusterenv median wall / SB3 median wall = {summary['wall_ratio']:.3f} (target <= 0.5)"
        )
    clean = {k: (None if v == float("inf") else v) for k, v in summary.items()}
    payload = {
        "args": vars(args) | {"out": str(args.out)},
        "rl_zoo_hyperparameters": RL_ZOO_CARTPOLE,
        "summary": clean,
        "clusterenv": ours,
        "sb3": theirs,
    }
    path = write_results("time_to_solve", payload, args.out)
    print(f"\nwrote {path}")
    return 0


def _fmt_run(r: dict[str, Any]) -> str:
    state = "solved" if r["solved"] else "NOT solved"
    return f"{state} at {r['env_steps']} env steps, {r['wall_s']:.1f} s, {r['updates']} updates"


if __name__ == "__main__":
    raise SystemExit(main())
