"""RemoteSB3VecEnv against SB3's own DummyVecEnv, and an SB3 `learn` on real workers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence

from clusterenv.pipeline.cluster.embedded import LocalWorkers

sb3 = pytest.importorskip("stable_baselines3")
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor  # noqa: E402

from clusterenv.pipeline.remote_env.sb3 import RemoteSB3VecEnv  # noqa: E402

HELPERS = "tests.pipeline.remote_env.remote_env_helpers"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sb3_remote(redis_url: str, workers: LocalWorkers) -> Iterator:
    made: list[RemoteSB3VecEnv] = []

    def make(env_id: str = "CartPole-v1", num_envs: int = 4, **kw) -> RemoteSB3VecEnv:
        env = RemoteSB3VecEnv(env_id, num_envs, redis_url=redis_url, shards=2, **kw)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def test_transitions_equal_dummy_vec_env(sb3_remote) -> None:
    # A short TimeLimit, so both terminations and truncations happen in 200 steps.
    envs = sb3_remote(env_kwargs={"max_episode_steps": 25})
    local = DummyVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=25)] * 4)
    assert envs.observation_space == local.observation_space
    assert envs.action_space == local.action_space
    assert envs.seed(21) == local.seed(21)
    np.testing.assert_array_equal(envs.reset(), local.reset())
    assert envs.reset_infos == local.reset_infos
    rng = np.random.default_rng(0)
    ends = {"terminal": 0, "truncated": 0}
    for _ in range(200):
        actions = rng.integers(0, 2, size=4)
        envs.step_async(actions)
        local.step_async(actions)
        obs, rewards, dones, infos = envs.step_wait()
        lobs, lrewards, ldones, linfos = local.step_wait()
        np.testing.assert_array_equal(obs, lobs)
        assert rewards.dtype == lrewards.dtype == np.float32
        np.testing.assert_array_equal(rewards, lrewards)
        np.testing.assert_array_equal(dones, ldones)
        # terminal_observation at episode ends (the obs returned is the next episode's first).
        assert data_equivalence(infos, linfos, exact=True), f"{infos}\n!=\n{linfos}"
        for info in infos:
            if "terminal_observation" in info:
                ends["truncated" if info["TimeLimit.truncated"] else "terminal"] += 1
    assert envs.reset_infos == local.reset_infos
    assert ends["terminal"] >= 4 and ends["truncated"] >= 4, ends


def test_attributes_and_wrappers_are_asked_of_the_workers(sb3_remote) -> None:
    envs = sb3_remote(num_envs=2)
    assert envs.render_mode is None  # VecEnv.__init__ asked the workers (get_attr)
    assert envs.get_attr("gravity") == [9.8, 9.8]
    envs.set_attr("gravity", 3.0, indices=[1])
    assert envs.get_attr("gravity") == [9.8, 3.0]
    assert envs.env_method("get_wrapper_attr", "length", indices=0) == [0.5]
    assert envs.env_is_wrapped(gym.wrappers.TimeLimit) == [True, True]
    assert envs.env_is_wrapped(Monitor) == [False, False]
    assert not envs.has_attr("no_such_attribute")


@pytest.mark.slow  # ~10 s here, most of it PPO's updates; the DQN test below is the quick learn
def test_ppo_learns_on_remote_envs(sb3_remote) -> None:
    envs = VecMonitor(sb3_remote(num_envs=2))
    model = sb3.PPO("MlpPolicy", envs, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.learn(total_timesteps=384)
    assert model.num_timesteps == 384
    # VecMonitor saw whole episodes end through the adapter's dones.
    assert len(model.ep_info_buffer) >= 5
    assert all(ep["l"] > 0 for ep in model.ep_info_buffer)


def test_dqn_learns_on_a_dict_observation_env(sb3_remote) -> None:
    # SB3's MultiInputPolicy on a Dict observation that is batched per leaf on the way back.
    spec = gym.make(f"{HELPERS}:RemoteTestDictObs-v0").spec
    model = sb3.DQN(
        "MultiInputPolicy", sb3_remote(spec, num_envs=2), learning_starts=32, seed=0, device="cpu"
    )
    model.learn(total_timesteps=96)
    assert model.num_timesteps == 96


def test_pipeline_does_not_import_stable_baselines3() -> None:
    code = "import sys, clusterenv.pipeline.remote_env, clusterenv.tasks.env_shard; print('stable_baselines3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
