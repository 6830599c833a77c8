"""SB3's side of the comparisons with clusterenv: RL-Zoo's DQN settings, the trial (env, budget
and the one eval protocol) both systems run under, and SB3 DQN run to it in this process.

Shared by bench/time_to_solve.py, bench/presets.py (--sb3) and bench/update_cost.py.
SB3 is the optional bench dependency: pip install -e '.[bench]'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# RL-Zoo hyperparams/dqn.yml, CartPole-v1 (n_timesteps there is 5e4; the budget here is a flag,
# so exploration is rescaled to end where RL-Zoo's does: after 0.16 x 5e4 = 8,000 env steps).
RL_ZOO_TIMESTEPS = 50_000
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


@dataclass(frozen=True)
class Trial:
    """What both systems run under: the env, the budget and the one eval protocol."""

    env: str
    env_kwargs: dict[str, Any]
    budget: int
    eval_every: int
    episodes: int
    target: float
    solve_evals: int


def hits(evals: list[tuple[int, float, float]], target: float, n: int) -> tuple[Any, Any]:
    """(env steps, wall s) of the first eval >= target, and of the first of `n` consecutive ones."""
    first = next(((s, w) for s, w, r in evals if r >= target), None)
    run = 0
    for i, (_, _, r) in enumerate(evals):
        run = run + 1 if r >= target else 0
        if run == n:
            return first, evals[i - n + 1][:2]
    return first, None


def sb3_run(
    seed: int,
    trial: Trial,
    threads: int,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """SB3 DQN with RL-Zoo's settings (`params`; by default CartPole-v1's, exploration rescaled to
    the budget), stopped at the first of `solve_evals` evals >= target."""
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
            self.eval_env = make_vec_env(
                trial.env, n_envs=trial.episodes, seed=seed + 10**6, env_kwargs=trial.env_kwargs
            )
            self.evals: list[tuple[int, float, float]] = []
            self.t0 = 0.0
            self.run = 0

        def _on_step(self) -> bool:
            if self.num_timesteps % trial.eval_every:
                return True
            returns, _ = evaluate_policy(
                self.model,
                self.eval_env,
                n_eval_episodes=trial.episodes,
                deterministic=True,
                return_episode_rewards=True,
            )
            mean = float(sum(returns) / len(returns))
            self.evals.append((self.num_timesteps, round(time.perf_counter() - self.t0, 3), mean))
            self.run = self.run + 1 if mean >= trial.target else 0
            return self.run < trial.solve_evals

    train_env = make_vec_env(trial.env, n_envs=1, seed=seed, env_kwargs=trial.env_kwargs)
    if params is None:
        params = RL_ZOO_CARTPOLE | {
            "exploration_fraction": min(
                1.0, RL_ZOO_CARTPOLE["exploration_fraction"] * RL_ZOO_TIMESTEPS / trial.budget
            )
        }
    model = DQN("MlpPolicy", train_env, seed=seed, device="cpu", verbose=0, **params)
    cb = SolveCallback()
    cb.t0 = time.perf_counter()
    model.learn(total_timesteps=trial.budget, callback=cb)
    wall = time.perf_counter() - cb.t0
    train_env.close()
    cb.eval_env.close()
    first, confirmed = hits(cb.evals, trial.target, trial.solve_evals)
    return {
        "seed": seed,
        "solved": confirmed is not None,
        "first_hit": first,
        "env_steps": confirmed[0] if confirmed else model.num_timesteps,
        "wall_s": confirmed[1] if confirmed else round(wall, 3),
        "updates": int(model._n_updates),
        "evals": cb.evals,
    }
