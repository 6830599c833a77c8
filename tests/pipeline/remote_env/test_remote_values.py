"""What remote envs return, against the same envs made locally: types, Dict/Tuple spaces, EnvSpecs, autoreset modes.

Real workers build the envs; the custom env lives in remote_env_helpers.py so that they can import it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.utils.env_match import check_environments_match
from gymnasium.vector import AutoresetMode

from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.remote_env import RemoteEnv
from clusterenv.pipeline.remote_env.messages import EnvTarget

HELPERS = "tests.pipeline.remote_env.remote_env_helpers"
SPACES = f"{HELPERS}:RemoteTestSpaces-v0"
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "env_id, steps",
    [
        (
            "LunarLander-v3",
            150,
        ),  # np.float64 rewards (box2d from a wheel, see pyproject's test extra)
        ("FrozenLake-v1", 100),  # Discrete observations as Python ints, int rewards
        ("Blackjack-v1", 60),  # a Tuple of Discretes, returned as a tuple of ints
        (SPACES, 40),  # nested Dict/Tuple observations, a Tuple action, np.float32 rewards
    ],
)
def test_remote_env_matches_local_env_types_included(
    env_id: str, steps: int, redis_url: str, workers: LocalWorkers
) -> None:
    remote = RemoteEnv(env_id, redis_url=redis_url)
    local = gym.make(env_id)
    try:
        # gymnasium's own check: spaces equal, and every obs, reward and info data_equivalent
        # (same Python / numpy type, same dtype) over resets and steps.
        check_environments_match(local, remote, num_steps=steps, seed=5)
        obs, _ = remote.reset(seed=1)
        lobs, _ = local.reset(seed=1)
        assert type(obs) is type(lobs)
        action = local.action_space.sample()
        got, want = remote.step(action), local.step(action)
        assert [type(x) for x in got] == [type(x) for x in want]
        assert data_equivalence(got, want, exact=True)
    finally:
        remote.close()


def _same_vector_steps(envs, local, steps: int, seed: int) -> int:
    """Step both with the same random actions; assert equal results; return the episode ends seen."""
    got, want = envs.reset(seed=seed), local.reset(seed=seed)
    assert data_equivalence(got, want, exact=True)
    local.action_space.seed(seed)
    ends = 0
    for _ in range(steps):
        actions = local.action_space.sample()
        got, want = envs.step(actions), local.step(actions)
        assert data_equivalence(got, want, exact=True), f"{got}\n!=\n{want}"
        ends += int(np.sum(got[2] | got[3]))
    return ends


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_dict_and_tuple_spaces_match_sync_vector_env(remote, mode: AutoresetMode) -> None:
    envs = remote(SPACES, num_envs=3, autoreset_mode=mode)
    local = gym.vector.SyncVectorEnv(
        [lambda: gym.make(SPACES) for _ in range(3)], autoreset_mode=mode
    )
    assert envs.single_observation_space == local.single_observation_space
    assert envs.observation_space == local.observation_space
    assert envs.action_space == local.action_space
    assert envs.metadata["autoreset_mode"] is mode
    # Infos too, SAME_STEP's final_obs / final_info included; 5-step episodes end many times.
    assert _same_vector_steps(envs, local, 24, seed=3) >= 12


def test_same_step_cartpole_matches_sync_vector_env(remote) -> None:
    mode = AutoresetMode.SAME_STEP
    envs = remote(num_envs=4, autoreset_mode=mode, env_kwargs={"max_episode_steps": 15})
    local = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=15) for _ in range(4)],
        autoreset_mode=mode,
    )
    assert _same_vector_steps(envs, local, 60, seed=11) >= 12


def _wrapped_spec() -> gym.envs.registration.EnvSpec:
    env = gym.make("CartPole-v1", max_episode_steps=20)
    env = gym.wrappers.TimeAwareObservation(env)
    return gym.wrappers.ClipReward(env, 0.0, 0.5).spec


def test_env_spec_wrapper_stack_runs_on_the_workers(remote) -> None:
    spec = _wrapped_spec()
    envs = remote(spec, num_envs=2)
    local = gym.vector.SyncVectorEnv([lambda: gym.make(spec) for _ in range(2)])
    # TimeAwareObservation adds the step count: 5 dims, float64, as the local stack has.
    assert envs.single_observation_space.shape == (5,)
    assert envs.single_observation_space == local.single_observation_space
    obs, _ = envs.reset(seed=0)
    obs, reward, _, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))
    np.testing.assert_array_equal(reward, [0.5, 0.5])  # ClipReward(0, 0.5)
    np.testing.assert_array_equal(obs[:, -1], [1.0, 1.0])  # the time feature
    # Steps alternate the push, so neither pole falls: TimeLimit(20) truncates both at step 20.
    for t in range(2, 21):
        _, _, terminated, truncated, _ = envs.step(np.full(2, t % 2, dtype=np.int64))
    assert truncated.all() and not terminated.any()
    assert _same_vector_steps(envs, local, 45, seed=4) >= 2


def test_env_spec_that_is_not_json_is_refused_before_placement() -> None:
    env = gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: 2 * r)
    with pytest.raises(ValueError, match="cannot travel to the workers as JSON"):
        EnvTarget.of(env.spec)


def test_get_set_call_run_on_the_workers(remote) -> None:
    envs = remote(num_envs=3)
    assert envs.get_attr("gravity") == (9.8, 9.8, 9.8)
    envs.set_attr("gravity", [1.0, 2.0, 3.0])
    assert envs.get_attr("gravity") == (1.0, 2.0, 3.0)
    assert envs.call("get_wrapper_attr", "length") == (0.5, 0.5, 0.5)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        envs.get_attr("no_such_attribute")
