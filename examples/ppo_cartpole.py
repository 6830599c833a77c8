"""PPO on CartPole, CleanRL-style, with the envs stepped on Celery workers (RemoteVectorEnv).

The only change from a local script is the env constructor (see docs/remote_env.md):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(args.env_id)] * args.num_envs)
becomes
    envs = RemoteVectorEnv(args.env_id, args.num_envs, redis_url=args.redis_url)
Run:  python examples/ppo_cartpole.py --total-timesteps 100000   (add --redis-url for your workers)
"""

import random
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical

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
    total_timesteps: int = 100_000
    """total env steps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer (annealed linearly to 0)"""
    num_steps: int = 128
    """steps per env in each rollout"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches per epoch"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value function loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for gradient clipping"""


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
            nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0),
        )  # fmt: skip
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
            nn.Tanh(), layer_init(nn.Linear(64, num_actions), std=0.01),
        )  # fmt: skip

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


if __name__ == "__main__":
    args = tyro.cli(Args)
    batch_size = args.num_envs * args.num_steps
    num_iterations = max(1, args.total_timesteps // batch_size)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    # ---- env setup: the one line that differs from a local script ----
    envs = RemoteVectorEnv(args.env_id, args.num_envs, redis_url=args.redis_url)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "discrete actions only"
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    shape = (args.num_steps, args.num_envs)
    obs = torch.zeros((*shape, obs_dim))
    actions, logprobs, rewards, values = (torch.zeros(shape) for _ in range(4))
    terms, dones, valid = (torch.zeros(shape) for _ in range(3))
    returns: list[float] = []
    global_step, start_time = 0, time.time()
    next_obs = torch.as_tensor(envs.reset(seed=args.seed)[0])
    # NEXT_STEP autoreset: the step after a done returns the reset obs and ignores the action,
    # so that step is not a sample; it is masked out of the loss below.
    autoreset = np.zeros(args.num_envs, dtype=bool)
    try:
        for iteration in range(1, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # ---- rollout ----
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                valid[step] = torch.as_tensor(~autoreset, dtype=torch.float32)
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
                next_np, reward, term, trunc, infos = envs.step(action.numpy())
                rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
                terms[step] = torch.as_tensor(term, dtype=torch.float32)
                dones[step] = torch.as_tensor(term | trunc, dtype=torch.float32)
                autoreset = term | trunc
                next_obs = torch.as_tensor(next_np)
                if "episode" in infos:
                    for i in np.flatnonzero(infos["_episode"]):
                        returns.append(float(infos["episode"]["r"][i]))
                        print(
                            f"global_step={global_step}, charts/episodic_return={returns[-1]:.0f}"
                        )

            # ---- GAE: obs[t+1] after a done is the episode's final obs, so truncation bootstraps
            # from V(final obs) and termination from 0; (1 - done) cuts the recursion there ----
            with torch.no_grad():
                next_value = agent.get_value(next_obs).flatten()
                advantages = torch.zeros(shape)
                lastgaelam = torch.zeros(args.num_envs)
                for t in reversed(range(args.num_steps)):
                    nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * (1 - terms[t]) - values[t]
                    lastgaelam = delta + args.gamma * args.gae_lambda * (1 - dones[t]) * lastgaelam
                    advantages[t] = lastgaelam
                returns_t = advantages + values

            # ---- update on the valid samples only ----
            keep = valid.reshape(-1).bool()
            b_obs = obs.reshape(-1, obs_dim)[keep]
            b_logprobs, b_actions = logprobs.reshape(-1)[keep], actions.reshape(-1)[keep]
            b_adv, b_ret = advantages.reshape(-1)[keep], returns_t.reshape(-1)[keep]
            b_values = values.reshape(-1)[keep]
            n = len(b_obs)
            minibatch = max(1, n // args.num_minibatches)
            for _ in range(args.update_epochs):
                perm = torch.randperm(n)
                for start in range(0, n, minibatch):
                    mb = perm[start : start + minibatch]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                        b_obs[mb], b_actions[mb].long()
                    )
                    ratio = (newlogprob - b_logprobs[mb]).exp()
                    mb_adv = b_adv[mb]
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std(unbiased=False) + 1e-8)
                    pg_loss = torch.max(
                        -mb_adv * ratio,
                        -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef),
                    ).mean()
                    newvalue = newvalue.view(-1)
                    v_clipped = b_values[mb] + torch.clamp(
                        newvalue - b_values[mb], -args.clip_coef, args.clip_coef
                    )
                    v_loss = (
                        0.5
                        * torch.max(
                            (newvalue - b_ret[mb]) ** 2, (v_clipped - b_ret[mb]) ** 2
                        ).mean()
                    )
                    loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
            sps = int(global_step / (time.time() - start_time))
            print(f"global_step={global_step}, losses/value_loss={v_loss.item():.3f}, "
                  f"losses/policy_loss={pg_loss.item():.4g}, charts/SPS={sps}")  # fmt: skip
    finally:
        envs.close()
    tail = returns[-10:]
    print(f"episodes={len(returns)}, charts/mean_return_last10={np.mean(tail) if tail else 0:.1f}")
