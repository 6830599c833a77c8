"""DQN on CartPole, CleanRL-style, with the envs stepped on Celery workers (RemoteVectorEnv).

The only change from a local script is the env constructor (see docs/remote_env.md):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(args.env_id)] * args.num_envs)
becomes
    envs = RemoteVectorEnv(args.env_id, args.num_envs, redis_url=args.redis_url)
Run:  python examples/dqn_cartpole.py --total-timesteps 60000   (add --redis-url to use your workers)
"""

import random
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from clusterenv.pipeline.remote_env import RemoteVectorEnv


@dataclass
class Args:
    seed: int = 1
    """seed of the experiment (env i is reset with seed + i)"""
    redis_url: str | None = None
    """broker of the workers; None starts an embedded server and local workers"""
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    num_envs: int = 4
    """the number of parallel envs"""
    total_timesteps: int = 60_000
    """total env steps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    buffer_size: int = 10_000
    """the replay memory size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 500
    """env steps between target network updates"""
    batch_size: int = 128
    """the batch size sampled from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` it takes from start_e to end_e"""
    learning_starts: int = 10_000
    """env steps before learning starts"""
    train_frequency: int = 10
    """env steps between gradient steps"""


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_actions),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


class ReplayBuffer:
    """A numpy ring of (obs, action, reward, next_obs, terminated)."""

    def __init__(self, size: int, obs_dim: int):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros(size, np.int64)
        self.rewards = np.zeros(size, np.float32)
        self.terminated = np.zeros(size, np.float32)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, action, reward, next_obs, terminated) -> None:
        i = self.pos
        self.obs[i], self.actions[i], self.rewards[i] = obs, action, reward
        self.next_obs[i], self.terminated[i] = next_obs, terminated
        self.pos = (i + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, n: int, rng: np.random.Generator) -> list[torch.Tensor]:
        idx = rng.integers(0, self.size if self.full else self.pos, size=n)
        arrays = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated)
        return [torch.as_tensor(a[idx]) for a in arrays]


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


if __name__ == "__main__":
    args = tyro.cli(Args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)

    # ---- env setup: the one line that differs from a local script ----
    envs = RemoteVectorEnv(args.env_id, args.num_envs, redis_url=args.redis_url)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "discrete actions only"
    obs_dim = int(np.prod(envs.single_observation_space.shape))

    q_network = QNetwork(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(obs_dim, int(envs.single_action_space.n))
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, obs_dim)
    start_time = time.time()
    returns: list[float] = []

    obs, _ = envs.reset(seed=args.seed)
    # NEXT_STEP autoreset: the step after a done returns the reset obs and ignores the action.
    autoreset = np.zeros(args.num_envs, dtype=bool)
    try:
        for iteration in range(args.total_timesteps // args.num_envs):
            global_step = iteration * args.num_envs
            # ---- act: epsilon-greedy on Q ----
            epsilon = linear_schedule(
                args.start_e, args.end_e, int(args.exploration_fraction * args.total_timesteps),
                global_step,
            )  # fmt: skip
            if random.random() < epsilon:
                actions = rng.integers(0, envs.single_action_space.n, size=args.num_envs)
            else:
                with torch.no_grad():
                    actions = q_network(torch.as_tensor(obs)).argmax(dim=1).numpy()
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)

            if "episode" in infos:
                for i in np.flatnonzero(infos["_episode"]):
                    returns.append(float(infos["episode"]["r"][i]))
                    print(f"global_step={global_step}, charts/episodic_return={returns[-1]:.0f}")

            # ---- store: the autoreset step is not a transition; truncation still bootstraps ----
            for i in np.flatnonzero(~autoreset):
                rb.add(obs[i], actions[i], rewards[i], next_obs[i], terminations[i])
            autoreset = terminations | truncations
            obs = next_obs

            # ---- train ----
            if global_step > args.learning_starts and iteration % args.train_frequency == 0:
                b_obs, b_act, b_rew, b_next, b_term = rb.sample(args.batch_size, rng)
                with torch.no_grad():
                    target_max = target_network(b_next).max(dim=1).values
                    td_target = b_rew + args.gamma * target_max * (1 - b_term)
                old_val = q_network(b_obs).gather(1, b_act[:, None]).squeeze(1)
                loss = F.mse_loss(td_target, old_val)
                if iteration % 100 == 0:
                    sps = int(global_step / (time.time() - start_time))
                    print(f"global_step={global_step}, losses/td_loss={loss.item():.4f}, "
                          f"charts/SPS={sps}")  # fmt: skip
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            if iteration % (args.target_network_frequency // args.num_envs or 1) == 0:
                for t_param, q_param in zip(
                    target_network.parameters(), q_network.parameters(), strict=True
                ):
                    t_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * t_param.data)
    finally:
        envs.close()
    tail = returns[-10:]
    print(f"episodes={len(returns)}, charts/mean_return_last10={np.mean(tail) if tail else 0:.1f}")
