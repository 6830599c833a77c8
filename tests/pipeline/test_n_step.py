"""n-step returns at ingest (pipeline/n_step.py) against a hand computation, across a
termination, a truncation, the autoreset that follows them, and a chunk's end."""

from __future__ import annotations

import numpy as np
import pytest

from clusterenv.pipeline.frames import NEXT_FRAMES, OBS_FRAMES
from clusterenv.pipeline.n_step import STEPS, n_step_returns


def chunk() -> dict[str, np.ndarray]:
    """Two envs, six steps each, time-major as the actor writes them. Env 0 terminates at t2 (its
    t3 is the next episode's first step), env 1 is truncated at t3. next_obs = 100 * env + t."""
    t, env = np.repeat(np.arange(6), 2), np.tile(np.arange(2), 6)
    reward = np.where(env == 0, t + 1, 10 * (t + 1)).astype(np.float32)
    return {
        "obs": (100 * env + t - 1).astype(np.float32)[:, None],
        "action": (t % 2).astype(np.int64),
        "reward": reward,
        "next_obs": (100 * env + t).astype(np.float32)[:, None],
        "terminated": ((env == 0) & (t == 2)).astype(np.float32),
        "truncated": ((env == 1) & (t == 3)).astype(np.float32),
        "env_index": env.astype(np.int32),
    }


# (env, t) -> (return, window length, next_obs of the window's last row, terminated), n=3, γ=0.5
EXPECTED = {
    (0, 0): (1 + 0.5 * 2 + 0.25 * 3, 3, 2, 1.0),  # the window ends on the terminated row
    (0, 1): (2 + 0.5 * 3, 2, 2, 1.0),
    (0, 2): (3, 1, 2, 1.0),
    (0, 3): (4 + 0.5 * 5 + 0.25 * 6, 3, 5, 0.0),  # the next episode: never reaches back
    (0, 4): (5 + 0.5 * 6, 2, 5, 0.0),  # the chunk's end: a shorter window, bootstrapped
    (0, 5): (6, 1, 5, 0.0),
    (1, 0): (10 + 0.5 * 20 + 0.25 * 30, 3, 102, 0.0),
    (1, 1): (20 + 0.5 * 30 + 0.25 * 40, 3, 103, 0.0),  # ends on the truncated row: bootstraps
    (1, 2): (30 + 0.5 * 40, 2, 103, 0.0),  # from its true final observation
    (1, 3): (40, 1, 103, 0.0),
    (1, 4): (50 + 0.5 * 60, 2, 105, 0.0),
    (1, 5): (60, 1, 105, 0.0),
}


def test_returns_match_a_hand_computation_across_episode_ends_and_the_chunks_end():
    arrays = chunk()
    out = n_step_returns(arrays, n=3, gamma=0.5)
    for row in range(12):
        env, t = int(arrays["env_index"][row]), row // 2
        ret, k, nxt, term = EXPECTED[(env, t)]
        assert out["reward"][row] == pytest.approx(ret), (env, t)
        assert out[STEPS][row] == k, (env, t)
        assert out["next_obs"][row, 0] == nxt, (env, t)
        assert out["terminated"][row] == term, (env, t)
    # What the window does not touch stays the row's own.
    for name in ("obs", "action", "env_index", "truncated"):
        np.testing.assert_array_equal(out[name], arrays[name])


def test_one_step_is_the_chunk_itself():
    arrays = chunk()
    out = n_step_returns(arrays, n=1, gamma=0.99)
    for name in ("reward", "next_obs", "terminated"):
        np.testing.assert_array_equal(out[name], arrays[name])
    assert (out[STEPS] == 1).all()


def test_the_envs_rows_interleaved_any_way_give_the_same_returns():
    """Env 1's rows first, then env 0's (each env's own still in time order)."""
    arrays = chunk()
    order = np.concatenate([np.where(arrays["env_index"] == e)[0] for e in (1, 0)])
    out = n_step_returns({k: v[order] for k, v in arrays.items()}, n=3, gamma=0.5)
    for i, row in enumerate(order):
        env, t = int(arrays["env_index"][row]), row // 2
        assert out["reward"][i] == pytest.approx(EXPECTED[(env, t)][0])
        assert out["next_obs"][i, 0] == EXPECTED[(env, t)][2]


def test_frame_chunks_point_next_frames_at_the_windows_last_row():
    arrays = chunk()
    frames = {k: v for k, v in arrays.items() if k not in ("obs", "next_obs")}
    frames[OBS_FRAMES] = arrays["obs"].astype(np.int64).repeat(4, axis=1)
    frames[NEXT_FRAMES] = arrays["next_obs"].astype(np.int64).repeat(4, axis=1)
    out = n_step_returns(frames, n=3, gamma=0.5)
    for row in range(12):
        env, t = int(arrays["env_index"][row]), row // 2
        assert (out[NEXT_FRAMES][row] == EXPECTED[(env, t)][2]).all()
    np.testing.assert_array_equal(out[OBS_FRAMES], frames[OBS_FRAMES])


def test_the_learner_stores_n_step_rows_and_replay_gives_their_window_back():
    from clusterenv.learner.dqn.config import DQNConfig
    from clusterenv.learner.dqn.learning import DQNLearner
    from clusterenv.learner.replay.rate_limiter import RateLimiter
    from clusterenv.learner.replay.uniform import ReplayBuffer

    cfg = DQNConfig(hidden="8", gamma=0.5, n_step=3, batch_size=4, learning_starts=4)
    replay = ReplayBuffer(64, (1,), np.dtype(np.float32))
    learner = DQNLearner((1,), 2, cfg, replay, RateLimiter(1.0, 4, 100.0), seed=0)
    assert learner.insert({}, chunk()) == 12
    stored = sorted(zip(replay.reward[:12].round(4).tolist(), replay.n_steps[:12].tolist(),
                        strict=True))  # fmt: skip
    assert stored == sorted((round(ret, 4), k) for ret, k, _, _ in EXPECTED.values())
    batch = replay.sample(8, np.random.default_rng(1))
    assert set(batch["n_steps"].tolist()) <= {1, 2, 3}
    learner.update(batch)  # the discount follows each row's window


def test_replay_saved_before_n_step_returns_restores_as_one_step_rows():
    from clusterenv.learner.replay.uniform import ReplayBuffer

    replay = ReplayBuffer(16, (1,), np.dtype(np.float32))
    replay.insert(n_step_returns(chunk(), n=3, gamma=0.5))
    rows, counters = replay.save()
    assert rows["n_steps"].max() == 3
    old = {k: v for k, v in rows.items() if k != "n_steps"}  # a checkpoint of an older version
    again = ReplayBuffer(16, (1,), np.dtype(np.float32))
    again.restore(old, counters)
    assert (again.n_steps[:12] == 1).all()
    np.testing.assert_array_equal(again.reward[:12], replay.reward[:12])


def test_a_run_with_n_step_returns_trains_through_the_real_loop(tmp_path):
    from clusterenv.learner.run.loop import Run
    from tests.inprocess import FakeCluster
    from tests.learner.test_loop import CHUNK, run_dir, small

    cfg = small()
    cfg.agent.n_step = 3
    run = Run.create(cfg, FakeCluster().factory, run_dir(tmp_path), "run-n")
    result = run.run()
    assert result.env_steps == 16 * CHUNK and result.updates > 0
    replay = run.learner.replay
    assert set(np.unique(replay.n_steps[: replay.size]).tolist()) == {1, 2, 3}
