"""Cost of one gradient step: clusterenv's Double-DQN update against SB3 DQN's, same net and batch.

Both sample a batch of 64 from a replay buffer holding 20,000 CartPole-shaped transitions and take
one Adam step on a 256-256 MLP with one torch thread: clusterenv through `DQNLearner.step()`,
SB3 through `DQN.train(gradient_steps=N)` (its own training loop, RL-Zoo CartPole settings).
clusterenv runs as its learner does, with subnormal floats flushed to zero (`configure_torch`);
SB3 as it ships, and once more with the same flag, so the table says what the flag is worth.
SB3 is the optional bench dependency: pip install -e '.[bench]'.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import mark_start, table, write_results
from bench.sb3_dqn import RL_ZOO_CARTPOLE
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.run.wiring import configure_torch

ROWS = 20_000


def fake_transitions(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(ROWS, 4)).astype(np.float32),
        "action": rng.integers(2, size=ROWS),
        "reward": np.ones(ROWS, np.float32),
        "next_obs": rng.normal(size=(ROWS, 4)).astype(np.float32),
        "terminated": rng.random(ROWS) < 0.05,
    }


def clusterenv_ms(steps: int, data: dict[str, np.ndarray]) -> float:
    replay = ReplayBuffer(100_000, (4,), np.float32)
    replay.add(data["obs"], data["action"], data["reward"], data["next_obs"], data["terminated"])
    limiter = RateLimiter(samples_per_insert=1e9, min_size=1, error_buffer=0.0)
    limiter.on_insert(ROWS)
    learner = DQNLearner((4,), 2, DQNConfig(), replay, limiter, seed=1)
    for _ in range(100):
        learner.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.step()
    return 1e3 * (time.perf_counter() - t0) / steps


def sb3_ms(steps: int, data: dict[str, np.ndarray]) -> float:
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=1), seed=1,
                device="cpu", verbose=0, **RL_ZOO_CARTPOLE)  # fmt: skip
    model._setup_learn(total_timesteps=1)
    for i in range(ROWS):
        model.replay_buffer.add(
            data["obs"][i][None], data["next_obs"][i][None], np.array([data["action"][i]]),
            data["reward"][i : i + 1], data["terminated"][i : i + 1], [{}],
        )  # fmt: skip
    model.train(gradient_steps=100, batch_size=64)
    t0 = time.perf_counter()
    model.train(gradient_steps=steps, batch_size=64)
    return 1e3 * (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.update_cost", description=__doc__.split("\n")[0]
    )
    p.add_argument("--steps", type=int, default=3000, help="timed gradient steps per repeat")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians reported")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default: bench/results/update_cost.json)",
    )
    args = p.parse_args(argv)
    mark_start()
    data = fake_transitions(np.random.default_rng(0))
    systems = {  # name: (gradient-step timer, subnormals flushed to zero)
        "clusterenv Double DQN": (clusterenv_ms, True),
        "SB3 DQN": (sb3_ms, False),
        "SB3 DQN, subnormals flushed (what-if)": (sb3_ms, True),
    }
    runs: dict[str, list[float]] = {name: [] for name in systems}
    configure_torch(1)  # the learner's torch; each system then sets the flag its row names
    for _ in range(args.repeats):  # interleaved, so a load change hits all
        for name, (timer, flush) in systems.items():
            torch.set_flush_denormal(flush)
            runs[name].append(timer(args.steps, data))
    sb3 = float(np.median(runs["SB3 DQN"]))
    rows = [
        {"system": name, "ms per gradient step": float(np.median(ms)),
         "per repeat": " ".join(f"{m:.3f}" for m in ms), "/ SB3": float(np.median(ms)) / sb3}
        for name, ms in runs.items()
    ]  # fmt: skip
    print(table(rows, list(rows[0])))
    path = write_results(
        "update_cost", {"args": vars(args) | {"out": str(args.out)}, "runs": runs}, args.out
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
