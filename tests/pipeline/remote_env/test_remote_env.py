"""RemoteVectorEnv / RemoteEnv against a real server and real Celery workers.

A hosted shard occupies a whole (solo) worker process until its env is closed, so every test
closes its envs; the session has two workers, hence `shards=2` at most on them.
"""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

from clusterenv.pipeline.cluster.embedded import EmbeddedServer, LocalWorkers
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import ShardKeys, remote_env_replies
from clusterenv.pipeline.remote_env import RemoteEnv, RemoteEnvError, RemoteVectorEnv, ShardTimeout

# Built by the workers only (they run from the repo root); see remote_env_helpers.py.
HELPERS = "tests.pipeline.remote_env.remote_env_helpers"
FLAKY, TAGGED = f"{HELPERS}:RemoteTestFlaky-v0", f"{HELPERS}:RemoteTestTagged-v0"
pytestmark = pytest.mark.timeout(120)


def local_cartpoles(n: int, env_id: str = "CartPole-v1", **kw) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **kw) for _ in range(n)])


def test_spaces_and_metadata(remote) -> None:
    envs = remote(num_envs=5)
    local = local_cartpoles(5)
    assert envs.num_envs == 5
    assert envs.single_observation_space == local.single_observation_space
    assert envs.single_action_space == local.single_action_space
    assert envs.observation_space == local.observation_space
    assert envs.action_space == local.action_space
    assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert envs.metadata["render_fps"] == 50
    assert sorted(i for s in envs.shards for i in s["envs"]) == list(range(5))


def test_same_seeds_same_trajectories_as_sync_vector_env(remote) -> None:
    envs, local = remote(num_envs=6), local_cartpoles(6)
    obs, info = envs.reset(seed=7)
    lobs, linfo = local.reset(seed=7)
    np.testing.assert_array_equal(obs, lobs)
    assert obs.dtype == lobs.dtype
    rng = np.random.default_rng(0)
    dones = 0
    for _ in range(300):
        a = rng.integers(0, 2, size=6)
        got, want = envs.step(a), local.step(a)
        for g, w in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(g, w)
            assert g.dtype == w.dtype
        assert got[4].keys() == want[4].keys()
        dones += int(np.sum(got[2] | got[3]))
    assert dones > 20  # the comparison crossed many NEXT_STEP autoresets


def test_env_column_order_fixed_whoever_answers_first(remote) -> None:
    # Envs 0-1 (shard 0) sleep, so shard 1's reply always arrives first.
    envs = remote(TAGGED, num_envs=4, env_kwargs={"slow_below": 102, "delay_s": 0.02})
    obs, info = envs.reset(seed=100)
    np.testing.assert_array_equal(obs[:, 0], [100, 101, 102, 103])
    np.testing.assert_array_equal(info["seed"], [100, 101, 102, 103])
    for t in range(1, 5):
        obs, _, _, _, info = envs.step(np.zeros(4, dtype=np.int64))
        np.testing.assert_array_equal(obs[:, 0], [100, 101, 102, 103])
        np.testing.assert_array_equal(info["t"], [t] * 4)
        assert info["t"].dtype == np.int64 and info["_t"].all()


def test_remote_env_passes_check_env(redis_url: str, workers: LocalWorkers) -> None:
    env = RemoteEnv("CartPole-v1", redis_url=redis_url)
    try:
        check_env(env, skip_render_check=True)
        obs, _ = env.reset(seed=3)
        local = gym.make("CartPole-v1")
        np.testing.assert_array_equal(obs, local.reset(seed=3)[0])
        got, want = env.step(1), local.step(1)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1:4] == tuple(want[1:4]) and isinstance(got[1], float)
    finally:
        env.close()


def test_vector_wrappers_work(remote) -> None:
    envs = gym.wrappers.vector.RecordEpisodeStatistics(remote(num_envs=4))
    envs = gym.wrappers.vector.NormalizeObservation(envs)
    local = gym.wrappers.vector.RecordEpisodeStatistics(local_cartpoles(4))
    local = gym.wrappers.vector.NormalizeObservation(local)
    envs.reset(seed=1)
    local.reset(seed=1)
    returns, want = [], []
    rng = np.random.default_rng(1)
    for _ in range(120):
        a = rng.integers(0, 2, size=4)
        obs, _, _, _, info = envs.step(a)
        lobs, _, _, _, linfo = local.step(a)
        np.testing.assert_allclose(obs, lobs)
        if "episode" in info:
            returns += info["episode"]["r"][info["_episode"]].tolist()
            want += linfo["episode"]["r"][linfo["_episode"]].tolist()
    assert returns and returns == want


def test_bad_actions_raise_in_caller_and_envs_go_on(remote) -> None:
    envs, local = remote(num_envs=4), local_cartpoles(4)
    envs.reset(seed=5)
    local.reset(seed=5)
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(4,\)"):
        envs.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError, match="dtype float64"):
        envs.step(np.zeros(4))
    with pytest.raises(gym.error.InvalidAction, match="env 2 is outside"):
        envs.step(np.array([0, 1, 7, 0]))
    # Nothing was sent: the next good step is the first step, exactly as locally.
    a = np.array([1, 0, 1, 1])
    for g, w in zip(envs.step(a)[:4], local.step(a)[:4], strict=True):
        np.testing.assert_array_equal(g, w)


def test_unknown_env_id_raises_clearly(redis_url: str, workers: LocalWorkers) -> None:
    with pytest.raises(RemoteEnvError, match="NoSuchEnv") as exc:
        RemoteVectorEnv("NoSuchEnv-v0", 2, redis_url=redis_url, shards=2)
    assert exc.value.errors[0]["where"] == "make"


def test_env_raising_in_step_raises_and_others_go_on(remote) -> None:
    envs = remote(FLAKY, num_envs=4, env_kwargs={"fail_seed": 102, "fail_at": 3})
    local = local_cartpoles(4)
    envs.reset(seed=100)
    local.reset(seed=100)
    a = np.ones(4, dtype=np.int64)
    for _ in range(2):
        envs.step(a), local.step(a)
    with pytest.raises(
        RemoteEnvError, match=r"env 2 .*raised in step\(\): RuntimeError: boom"
    ) as e:
        envs.step(a)
    obs, rew, term, trunc, info = e.value.result
    want = local.step(a)
    keep = [0, 1, 3]
    np.testing.assert_array_equal(obs[keep], want[0][keep])
    assert trunc[2] and not term[2] and info["env_error"][2] and info["_env_error"].sum() == 1
    assert "remote_env_helpers.py" in e.value.errors[0]["traceback"]
    # The failed env autoresets on the next step (NEXT_STEP); the others keep their episodes.
    obs, rew, term, trunc, _ = envs.step(a)
    want = local.step(a)
    np.testing.assert_array_equal(obs[keep], want[0][keep])
    assert rew[2] == 0.0 and not trunc[2]


def test_env_raising_in_step_starts_a_new_episode_at_once_in_same_step_mode(remote) -> None:
    envs = remote(
        FLAKY, num_envs=2, autoreset_mode="SameStep", env_kwargs={"fail_seed": 1, "fail_at": 2}
    )
    envs.reset(seed=0)
    a = np.ones(2, dtype=np.int64)
    last = envs.step(a)[0]
    with pytest.raises(RemoteEnvError, match="boom") as e:
        envs.step(a)
    obs, rew, term, trunc, info = e.value.result
    assert trunc[1] and not term[1] and info["env_error"][1]
    # SAME_STEP: the failed episode's last observation is its final_obs, and env 1 was reset.
    np.testing.assert_array_equal(info["final_obs"][1], last[1])
    assert info["_final_obs"].tolist() == [False, True]
    assert not np.array_equal(obs[1], last[1])
    np.testing.assert_array_equal(envs.step(a)[1], [1.0, 1.0])  # both step on, no autoreset step


def test_step_timeout_names_worker_and_env(remote) -> None:
    envs = remote(TAGGED, num_envs=2, timeout_s=0.5, env_kwargs={"slow_below": 1, "delay_s": 2.0})
    envs.reset(seed=0)
    t0 = time.monotonic()
    with pytest.raises(ShardTimeout, match=r"envs \[0\]\) on local\d-\w+@\S+ pid \d+"):
        envs.step(np.zeros(2, dtype=np.int64))
    assert time.monotonic() - t0 < 2.0


def test_close_frees_workers_and_keys(redis_url: str, workers: LocalWorkers, client) -> None:
    for _ in range(2):  # a second env placed right after close gets the same two workers
        envs = RemoteVectorEnv("CartPole-v1", 2, redis_url=redis_url, shards=2)
        session = envs.session
        envs.reset(seed=0)
        envs.close()
        assert not client.exists(*(ShardKeys(session, i).heartbeat for i in range(2)))
        assert not client.exists(remote_env_replies(session))


def test_embedded_stack_is_started_and_stopped() -> None:
    envs = RemoteVectorEnv("CartPole-v1", 2)
    pids = envs.owned_pids
    assert len(pids) == 1 + len(envs.shards)  # the server and one worker per shard
    try:
        obs, _ = envs.reset(seed=0)
        assert envs.step(np.zeros(2, dtype=np.int64))[0].shape == (2, 4)
    finally:
        envs.close()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize(
    # SAME_STEP's loss path (reset in the step, final_obs) in the slow set: ~8 s of worker starts.
    "mode",
    [AutoresetMode.NEXT_STEP, pytest.param(AutoresetMode.SAME_STEP, marks=pytest.mark.slow)],
)
def test_worker_death_truncates_replaces_and_never_hangs(tmp_path, mode: AutoresetMode) -> None:
    # Own server and workers: the kills must hit only processes this test started.
    server = EmbeddedServer()
    url = server.start()
    pool = LocalWorkers(url, 2, log_path=tmp_path / "workers.log")
    envs = None
    try:
        pool.start()
        pool.wait_ready(connect(url), expected=1)
        envs = RemoteVectorEnv(
            "CartPole-v1", 4, redis_url=url, shards=2, heartbeat_ttl_s=1.0, autoreset_mode=mode
        )
        envs.reset(seed=0)
        a = np.zeros(4, dtype=np.int64)
        before = envs.step(a)[0]
        victim = envs.shards[0]
        assert victim["pid"] in pool.pids
        os.killpg(victim["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        obs, rew, term, trunc, info = envs.step(a)
        assert time.monotonic() - t0 < 10
        lost = victim["envs"]
        assert trunc[lost].all() and not term[lost].any()
        assert info["worker_lost"][lost].all() and info["_worker_lost"].sum() == len(lost)
        assert len(envs.shards) == 1 and envs.shards[0]["envs"] == [0, 1, 2, 3]
        if mode == AutoresetMode.SAME_STEP:
            # The lost episodes end on their last observation; the fresh copies start at once.
            for i in lost:
                np.testing.assert_array_equal(info["final_obs"][i], before[i])
                assert not np.array_equal(obs[i], before[i])
            np.testing.assert_array_equal(envs.step(a)[1], np.ones(4))  # no autoreset step
        for _ in range(30):  # adopted envs autoreset, then every column steps on
            obs, rew, term, trunc, info = envs.step(a)
            assert "worker_lost" not in info
        # No survivor left: the envs go to a new worker through Celery.
        pool.add(1)
        survivor = envs.shards[0]["pid"]
        os.killpg(survivor, signal.SIGKILL)
        obs, rew, term, trunc, info = envs.step(a)
        assert trunc.all() and info["worker_lost"].all()
        assert envs.shards[0]["pid"] not in (victim["pid"], survivor)
        envs.step(a)
    finally:
        if envs is not None:
            envs.close()
        pool.stop()
        server.stop()
