"""SB3's side of the comparisons with clusterenv: RL-Zoo's DQN settings, the trial (env, budget
and the one eval protocol) both systems run under, and SB3 DQN run to it in this process.

Shared by bench/time_to_solve.py, bench/presets.py (--sb3), bench/update_cost.py and
bench/learning_curves.py. Both systems step the env clusterenv's workers make (`make_env`: a
plain id as gym.make gives it, MinAtar through its adapter); on MinAtar, SB3's Q-network is
MinAtar's own (`sb3_params_from_preset`), the one `--torso minatar` builds.
SB3 is the optional bench dependency: pip install -e '.[bench]'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


def sb3_sac_params_from_preset(env: str) -> dict[str, Any]:
    """SB3 SAC's arguments for clusterenv's SAC preset of `env`: the same settings in SB3's units
    (gradient steps per env step from samples per insert; the entropy coefficient tuned from its
    initial value, or fixed at it; gSDE's noise drawn once a rollout of --chunk-steps, as once a
    chunk here)."""
    from clusterenv.learner.tools.presets import defaults_for

    config = defaults_for(env, "sac", use_preset=True)
    d = config.agent
    every = config.collection.chunk_steps if d.gsde else 1
    policy_kwargs: dict[str, Any] = {"net_arch": [int(h) for h in d.hidden.split(",")]}
    if d.gsde:
        policy_kwargs["log_std_init"] = d.log_std_init
    return {
        "learning_rate": d.lr, "batch_size": d.batch_size, "buffer_size": d.buffer_size,
        "learning_starts": d.learning_starts, "gamma": d.gamma, "tau": d.tau,
        "train_freq": every, "gradient_steps": every * round(d.samples_per_insert / d.batch_size),
        "ent_coef": f"auto_{d.init_alpha}" if d.learn_alpha else d.init_alpha,
        "target_entropy": "auto" if d.target_entropy is None else d.target_entropy,
        "use_sde": d.gsde, "policy_kwargs": policy_kwargs,
    }  # fmt: skip


def sb3_params_from_preset(env: str, budget: int) -> dict[str, Any]:
    """SB3 DQN's arguments for clusterenv's DQN preset of `env`, in SB3's units: updates per env
    step from samples per insert, a target copy every so many env steps, epsilon's decay as a
    fraction of the budget; MinAtar's conv torso on 10 x 10 planes. Only what SB3 can express:
    plain DQN targets (a preset with double = true is refused), a constant learning rate."""
    from clusterenv.learner.tools.presets import defaults_for

    d = defaults_for(env, "dqn", use_preset=True).agent
    if d.double or d.lr_end is not None:
        raise ValueError(f"{env}'s preset uses double DQN or an lr schedule: SB3's DQN has neither")
    per_step = d.samples_per_insert / d.batch_size  # gradient steps per env step
    train_freq, gradient_steps = (1, round(per_step)) if per_step >= 1 else (round(1 / per_step), 1)
    params: dict[str, Any] = {
        "learning_rate": d.lr,
        "batch_size": d.batch_size,
        "buffer_size": d.buffer_size,
        "learning_starts": d.learning_starts,
        "gamma": d.gamma,
        "target_update_interval": round(d.target_update_every / per_step),
        "train_freq": train_freq,
        "gradient_steps": gradient_steps,
        "exploration_initial_eps": d.eps_start,
        "exploration_final_eps": d.eps_end,
        "exploration_fraction": min(1.0, d.eps_decay_steps / budget),
        "max_grad_norm": d.max_grad_norm,
    }
    if env.rpartition(":")[2].startswith("MinAtar/"):
        params["policy_kwargs"] = {"features_extractor_class": minatar_torso(), "net_arch": []}
    return params


def minatar_torso() -> type:
    """MinAtar's conv torso as an SB3 features extractor: 16 3x3 convolutions at stride 1, ReLU,
    a 128-unit layer, ReLU (SB3's Q head adds the output layer); observations taken as they come
    (0/1 planes: SB3 scales only 0-255 images)."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    class MinAtarTorso(BaseFeaturesExtractor):
        def __init__(self, space: Any, features_dim: int = 128):
            super().__init__(space, features_dim)
            c, h, w = space.shape
            self.net = nn.Sequential(
                nn.Conv2d(c, 16, 3, 1), nn.ReLU(), nn.Flatten(),
                nn.Linear(16 * (h - 2) * (w - 2), features_dim), nn.ReLU(),
            )  # fmt: skip

        def forward(self, obs: Any) -> Any:
            return self.net(obs)

    return MinAtarTorso


def sb3_run(
    seed: int,
    trial: Trial,
    threads: int,
    params: dict[str, Any] | None = None,
    algo: str = "dqn",
) -> dict[str, Any]:
    """SB3's DQN (or SAC with `algo` "sac") with RL-Zoo's settings (`params`; by default DQN's
    CartPole-v1 ones, exploration rescaled to the budget), stopped at the first of `solve_evals`
    evals >= target."""
    import torch
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    from clusterenv.pipeline.envs.make import make_env

    torch.set_num_threads(threads)

    class SolveCallback(BaseCallback):
        """EvalCallback's protocol, but stopping at the first mean >= target and timing it."""

        def __init__(self) -> None:
            super().__init__()
            self.eval_env = make_vec_env(
                env_maker(training=False), n_envs=trial.episodes, seed=seed + 10**6
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

    def env_maker(training: bool) -> Callable[[], Any]:
        return lambda: make_env(trial.env, trial.env_kwargs, training=training)

    train_env = make_vec_env(env_maker(training=True), n_envs=1, seed=seed)
    if params is None:
        params = RL_ZOO_CARTPOLE | {
            "exploration_fraction": min(
                1.0, RL_ZOO_CARTPOLE["exploration_fraction"] * RL_ZOO_TIMESTEPS / trial.budget
            )
        }
    cls = {"dqn": DQN, "sac": SAC}[algo]
    model = cls("MlpPolicy", train_env, seed=seed, device="cpu", verbose=0, **params)
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
