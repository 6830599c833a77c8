"""Cost of one gradient step: clusterenv's Double-DQN update against SB3 DQN's, same net and batch.

Both sample a batch of 64 from a replay buffer holding 20,000 CartPole-shaped transitions and take
one Adam step on a 256-256 MLP with one torch thread: clusterenv through `DQNLearner.step()`,
SB3 through `DQN.train(gradient_steps=N)` (its own training loop, RL-Zoo CartPole settings).
clusterenv runs as its learner does, with subnormal floats flushed to zero (`configure_torch`);
SB3 as it ships, and once more with the same flag, so the table says what the flag is worth.
SB3 is the optional bench dependency: pip install -e '.[bench]'.

Prioritized replay's cost (issue 32): the same update with `--prioritized` (sum-tree sampling,
importance weights, priorities written back), and the tree's work alone per batch (a stratified
sample of 64 and its priority update, 100,000 rows), against cpprb's PrioritizedReplayBuffer doing
the same where cpprb is installed (it is not a dependency: `pip install cpprb` to compare).

`--algo sac --env ENV` (issue 33): clusterenv's SAC update (`SACLearner.step()`) against SB3's
SAC (`SAC.train`), both with the env's SAC preset (in SB3's units for SB3: bench/sb3_dqn.py) on
20,000 random transitions of the env's shapes: where a SAC run's wall goes once the learner is
what limits it (docs/benchmarks.md, the expensive continuous env).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from bench.common import RESULTS_DIR, mark_start, table, write_results
from bench.sb3_dqn import RL_ZOO_CARTPOLE, sb3_sac_params_from_preset
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.replay.priorities import Prioritized
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.run.wiring import configure_torch
from clusterenv.learner.sac.learning import SACLearner
from clusterenv.learner.tools.presets import defaults_for
from clusterenv.pipeline.spaces import BoxActions

ROWS = 20_000


def fake_transitions(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(ROWS, 4)).astype(np.float32),
        "action": rng.integers(2, size=ROWS),
        "reward": np.ones(ROWS, np.float32),
        "next_obs": rng.normal(size=(ROWS, 4)).astype(np.float32),
        "terminated": rng.random(ROWS) < 0.05,
    }


def clusterenv_ms(steps: int, data: dict[str, np.ndarray], prioritized: bool = False) -> float:
    cfg = DQNConfig(prioritized=prioritized)
    sampler = Prioritized(100_000, cfg.priority_alpha, cfg.priority_beta) if prioritized else None
    replay = ReplayBuffer(100_000, (4,), np.float32, sampler=sampler)
    make = partial(DQNLearner, (4,), 2, cfg, seed=1)
    return ms_per_update(make, replay, data, steps, warmup=100)


def ms_per_update(
    make: Callable[..., DQNLearner | SACLearner],
    replay: ReplayBuffer,
    data: dict[str, np.ndarray],
    steps: int,
    warmup: int,
) -> float:
    """`data` into `replay`, a learner `make(replay=, limiter=)` that samples it without limit,
    `warmup` updates, then the milliseconds per update over `steps` more."""
    replay.add(data["obs"], data["action"], data["reward"], data["next_obs"], data["terminated"])
    limiter = RateLimiter(samples_per_insert=1e9, min_size=1, error_buffer=0.0)
    limiter.on_insert(ROWS)
    learner = make(replay=replay, limiter=limiter)
    for _ in range(warmup):
        learner.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.step()
    return 1e3 * (time.perf_counter() - t0) / steps


def tree_ms(steps: int, data: dict[str, np.ndarray]) -> float:
    """The sum tree's work per batch alone: sample 64 with their weights, write 64 priorities."""
    sampler, rng = Prioritized(100_000, 0.6, 0.4), np.random.default_rng(1)
    sampler.inserted(np.arange(100_000))
    td = np.abs(rng.normal(size=64))
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = sampler.sample(100_000, 64, rng)
        sampler.weights_of(idx)
        sampler.update(idx, td)
    return 1e3 * (time.perf_counter() - t0) / steps


def cpprb_ms(steps: int, data: dict[str, np.ndarray]) -> float:
    """cpprb's prioritized buffer doing the same (its sample also gathers the rows it stores)."""
    from cpprb import PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(100_000, {"obs": {"shape": 4}}, alpha=0.6, eps=1e-6)
    rb.add(obs=np.zeros((100_000, 4), np.float32))
    td = np.abs(np.random.default_rng(1).normal(size=64))
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = rb.sample(64, beta=0.4)
        rb.update_priorities(batch["indexes"], td)
    return 1e3 * (time.perf_counter() - t0) / steps


def sb3_ms(steps: int, data: dict[str, np.ndarray]) -> float:
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=1), seed=1,
                device="cpu", verbose=0, **RL_ZOO_CARTPOLE)  # fmt: skip
    return sb3_ms_per_update(model, data, steps, warmup=100, batch_size=64)


def sb3_ms_per_update(
    model: Any, data: dict[str, np.ndarray], steps: int, warmup: int, batch_size: int
) -> float:
    """`data` into an SB3 model's replay buffer one row at a time (as its collection adds them),
    `warmup` gradient steps of `model.train`, then the milliseconds per step over `steps` more."""
    model._setup_learn(total_timesteps=1)
    for i in range(ROWS):
        row = slice(i, i + 1)
        model.replay_buffer.add(
            data["obs"][row], data["next_obs"][row], data["action"][row], data["reward"][row],
            data["terminated"][row], [{}],
        )  # fmt: skip
    model.train(gradient_steps=warmup, batch_size=batch_size)
    t0 = time.perf_counter()
    model.train(gradient_steps=steps, batch_size=batch_size)
    return 1e3 * (time.perf_counter() - t0) / steps


def sac_transitions(
    obs_dim: int, space: gym.spaces.Box, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """ROWS random transitions of `obs_dim` observations, actions within `space`'s bounds."""
    return {
        "obs": rng.normal(size=(ROWS, obs_dim)).astype(np.float32),
        "action": rng.uniform(space.low, space.high, (ROWS, *space.shape)).astype(np.float32),
        "reward": rng.normal(size=ROWS).astype(np.float32),
        "next_obs": rng.normal(size=(ROWS, obs_dim)).astype(np.float32),
        "terminated": rng.random(ROWS) < 0.05,
    }


def clusterenv_sac_ms(
    steps: int, data: dict[str, np.ndarray], env_id: str, actions: BoxActions
) -> float:
    cfg = defaults_for(env_id, "sac", use_preset=True).agent
    obs_dim = data["obs"].shape[1]
    replay = ReplayBuffer(100_000, (obs_dim,), np.dtype(np.float32), actions.array)
    make = partial(SACLearner, obs_dim, actions, cfg, seed=1)
    return ms_per_update(make, replay, data, steps, warmup=20)


def sb3_sac_ms(steps: int, data: dict[str, np.ndarray], env_id: str) -> float:
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env

    params = sb3_sac_params_from_preset(env_id)
    model = SAC("MlpPolicy", make_vec_env(env_id, n_envs=1, seed=1), seed=1, device="cpu",
                verbose=0, **params)  # fmt: skip
    return sb3_ms_per_update(model, data, steps, warmup=20, batch_size=params["batch_size"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.update_cost", description=__doc__.split("\n")[0]
    )
    p.add_argument("--algo", choices=("dqn", "sac"), default="dqn",
                   help="whose update: Double DQN's on CartPole shapes, or SAC's on --env's")  # fmt: skip
    p.add_argument("--env", default="Pendulum-v1",
                   help="--algo sac: the env whose shapes and SAC preset both use")  # fmt: skip
    p.add_argument("--steps", type=int, default=None,
                   help="timed gradient steps per repeat (default: 3000 DQN, 500 SAC)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians reported")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default: bench/results/update_cost.json; update_cost_sac.json)",
    )
    args = p.parse_args(argv)
    mark_start()
    if args.algo == "sac":
        args.steps = args.steps or 500
        env = gym.make(args.env)  # its spaces only
        space, obs_dim = env.action_space, int(np.prod(env.observation_space.shape))
        env.close()
        data = sac_transitions(obs_dim, space, np.random.default_rng(0))
        sac_ms = partial(clusterenv_sac_ms, env_id=args.env, actions=BoxActions.of(space))
        systems = {
            "clusterenv SAC": (sac_ms, True),
            "SB3 SAC": (partial(sb3_sac_ms, env_id=args.env), False),
        }
        args.out = args.out or RESULTS_DIR / "update_cost_sac.json"
        return report(args, systems, data, "SB3 SAC")
    args.steps = args.steps or 3000
    data = fake_transitions(np.random.default_rng(0))
    systems = {
        "clusterenv Double DQN": (clusterenv_ms, True),
        "clusterenv Double DQN, prioritized": (partial(clusterenv_ms, prioritized=True), True),
        "sum tree alone (batch of 64)": (tree_ms, True),
        "SB3 DQN": (sb3_ms, False),
        "SB3 DQN, subnormals flushed (what-if)": (sb3_ms, True),
    }
    if importlib.util.find_spec("cpprb") is not None:
        systems["cpprb prioritized buffer alone (batch of 64)"] = (cpprb_ms, True)
    return report(args, systems, data, "SB3 DQN")


def report(
    args: argparse.Namespace,
    systems: dict[str, tuple[Callable[[int, dict[str, np.ndarray]], float], bool]],
    data: dict[str, np.ndarray],
    peer: str,
) -> int:
    """Time each system's gradient step (`systems`: name -> (timer, subnormals flushed to
    zero); interleaved repeats), print the table against `peer` (and prioritized replay's
    overhead where both DQN rows are there), write the results to --out."""
    runs: dict[str, list[float]] = {name: [] for name in systems}
    configure_torch(1)  # the learner's torch; each system then sets the flag its row names
    for _ in range(args.repeats):  # interleaved, so a load change hits all
        for name, (timer, flush) in systems.items():
            torch.set_flush_denormal(flush)
            runs[name].append(timer(args.steps, data))
    sb3 = float(np.median(runs[peer]))
    rows = [
        {"system": name, "ms per gradient step": float(np.median(ms)),
         "per repeat": " ".join(f"{m:.3f}" for m in ms), "/ SB3": float(np.median(ms)) / sb3}
        for name, ms in runs.items()
    ]  # fmt: skip
    print(table(rows, list(rows[0])))
    payload: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)}, "runs": runs}
    if "clusterenv Double DQN, prioritized" in runs:
        uniform, prioritized = (float(np.median(runs[f"clusterenv Double DQN{s}"]))
                                for s in ("", ", prioritized"))  # fmt: skip
        payload["prioritized_overhead"] = overhead = prioritized / uniform - 1
        print(f"\nprioritized replay's overhead: {overhead:+.1%} of an update (issue 32: <= 20%)")
    path = write_results("update_cost", payload, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
