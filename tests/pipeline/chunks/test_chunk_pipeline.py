"""Chunks through real Celery workers and a real stream: exact transitions, de-duplication, validation."""

from __future__ import annotations

import time
from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest
import redis

from clusterenv.pipeline.behaviour import EpsilonGreedy, EpsilonLadder
from clusterenv.pipeline.chunks.actor import Actor, env_seeds
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.runtime import WorkerRuntime
from clusterenv.pipeline.chunks.stream import StreamReader, StreamWriter
from clusterenv.pipeline.chunks.takers import RedisChunkTakers
from clusterenv.pipeline.codec import ArraySpec, encode_chunk
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.spaces import SpaceSpecs
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, url_of
from tests.pipeline.chunks.test_runtime_unit import brute_force_priorities

# A fixed linear policy (push towards the pole's lean; episodes of ~25-50 steps), so ingested data can be replayed locally.
POLICY = {
    "layers.0.weight": np.array([[0, 0, -1, 0], [0, 0, 1, 0]], np.float32),
    "layers.0.bias": np.zeros(2, np.float32),
}
ENV_KWARGS = {"max_episode_steps": 40}  # short episodes: both terminations and truncations


def reference_rollout(seed: int, steps: int) -> list[tuple]:
    """One env stepped as a NEXT_STEP vector env column would be, without any vector env."""
    env = gym.make("CartPole-v1", **ENV_KWARGS)
    policy = NumpyMLP(POLICY)
    obs, _ = env.reset(seed=seed)
    out, resetting = [], False
    for _ in range(steps):
        if resetting:  # the vector env's reset step: no transition
            obs, _ = env.reset()
            resetting = False
            continue
        action = int(policy(obs[None]).argmax(axis=1)[0])
        next_obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, action, reward, next_obs, terminated, truncated))
        resetting = terminated or truncated
        obs = next_obs
    return out


GREEDY = EpsilonGreedy(0.0)


def collect(celery_app, client, run_id, chunk_ids, num_envs, steps, per_task=1, timeout_s=30.0,
            behaviour=GREEDY, extra=None, **fields):  # fmt: skip
    """Send one task per `per_task` chunk ids (each task starting at one of `chunk_ids`); the
    reader expects the `extra` arrays, the requests carry the ChunkRequest `fields`."""
    keys = RunKeys(run_id)
    reader = StreamReader(
        connect(url_of(client), blocking=True),
        keys, CARTPOLE, extra,
    )  # fmt: skip
    for cid in chunk_ids:
        req = ChunkRequest(run_id, cid, "CartPole-v1", num_envs, steps, seed=5, behaviour=behaviour,
                           env_kwargs=ENV_KWARGS, chunks=per_task, **fields)  # fmt: skip
        celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
    expected = len(chunk_ids) * per_task
    got: list[tuple[dict, dict]] = []
    deadline = time.monotonic() + timeout_s
    while reader.stats.chunks + reader.stats.duplicates < expected:
        assert time.monotonic() < deadline, f"only {len(got)} of {expected} chunks arrived"
        reader.poll(lambda h, a: got.append((h, {k: v.copy() for k, v in a.items()})))
    return reader, got


@pytest.mark.parametrize("per_task", [1, 4])
def test_transitions_equal_a_local_rollout_across_chunks_and_episodes(
    workers, celery_app, client, run_id, per_task
):
    """Also with several chunks per task: each is its own stream entry, in order on one actor."""
    RedisWeightSource(client, RunKeys(run_id)).publish(POLICY)
    num_envs, steps, chunks = 3, 7, 24
    _, got = collect(
        celery_app, client, run_id, range(0, chunks, per_task), num_envs, steps, per_task
    )
    assert sorted(h["chunk"] for h, _ in got) == list(range(chunks))
    by_actor: dict[int, list] = defaultdict(list)
    for header, arrays in got:
        by_actor[header["actor"]].append((header["chunk"], arrays))
    assert sum(len(v) for v in by_actor.values()) == chunks
    kinds = set()
    for actor, parts in by_actor.items():
        parts.sort(key=lambda p: p[0])  # a worker process runs its chunks in dispatch order
        seeds = env_seeds(5, actor, num_envs)
        for i in range(num_envs):
            rows = [
                tuple(
                    a[k][j]
                    for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")
                )
                for _, a in parts
                for j in np.flatnonzero(a["env_index"] == i)
            ]
            ref = reference_rollout(seeds[i], steps * len(parts))
            assert len(rows) == len(ref), f"actor {actor} env {i}"
            for t, (r, e) in enumerate(zip(rows, ref, strict=True)):
                assert np.array_equal(r[0], e[0]) and np.array_equal(r[3], e[3]), f"obs at {t}"
                assert (r[1], float(r[2]), bool(r[4]), bool(r[5])) == (e[1], e[2], e[4], e[5])
                kinds.add("terminated" if e[4] else "truncated" if e[5] else "mid")
    assert kinds == {"terminated", "truncated", "mid"}, kinds


def test_each_actor_env_keeps_its_ladder_epsilon_from_chunk_to_chunk(
    workers, celery_app, client, run_id
):
    """Ape-X's ladder over 12 actor envs: a worker process's envs take the ladder's slots from
    its actor slot, the same in every chunk it collects, in both batches of tasks."""
    RedisWeightSource(client, RunKeys(run_id)).publish(POLICY)
    ladder = EpsilonLadder(0.4, 7.0, size=12)
    seen: dict[int, set[tuple[float, ...]]] = defaultdict(set)
    for batch in (range(0, 8), range(8, 16)):  # two rounds of tasks, apart in time
        _, got = collect(celery_app, client, run_id, batch, num_envs=3, steps=5, behaviour=ladder)
        for header, _ in got:
            seen[header["slot"]].add(tuple(header["epsilons"]))
    assert len(seen) >= 1
    for slot, epsilons in seen.items():
        assert len(epsilons) == 1, f"slot {slot} acted with {epsilons}"
        (eps,) = epsilons
        np.testing.assert_allclose(eps, ladder.epsilons(slot * 3, 3), atol=1e-6)  # 6 decimals


def test_workers_send_each_rows_td_error_when_asked_and_the_reader_takes_it(
    workers, celery_app, client, run_id
):
    """--initial-priority worker through real workers and the stream: each chunk carries a
    `priority` column, each row's |n-step TD error| under the published policy (recomputed here
    from the rows that arrived), and nothing of the Q-values acting kept."""
    RedisWeightSource(client, RunKeys(run_id)).publish(POLICY)
    _, got = collect(celery_app, client, run_id, range(4), num_envs=3, steps=30,
                     behaviour=EpsilonGreedy(0.2), extra={"priority": ArraySpec("<f4", ())},
                     priority_n_step=3, priority_gamma=0.9)  # fmt: skip
    assert len(got) == 4
    for _, arrays in got:
        assert not {"q_taken", "q_max"} & set(arrays)
        expected = brute_force_priorities(arrays, NumpyMLP(POLICY), 3, 0.9)
        np.testing.assert_allclose(arrays["priority"], expected, rtol=1e-4, atol=1e-5)


def test_a_chunk_delivered_twice_is_ingested_once(workers, celery_app, client, run_id):
    RedisWeightSource(client, RunKeys(run_id)).publish(POLICY)
    reader, got = collect(celery_app, client, run_id, [0, 0, 1], num_envs=2, steps=5)
    assert reader.stats.chunks == 2 and reader.stats.duplicates == 1
    assert sorted(h["chunk"] for h, _ in got) == [0, 1]
    assert client.xlen(RunKeys(run_id).stream) == 0  # acked and deleted


def test_malformed_and_foreign_entries_are_counted_and_skipped(client, run_id):
    keys = RunKeys(run_id)
    reader = StreamReader(connect(url_of(client), blocking=True), keys, CARTPOLE)
    n = 4
    good = {
        "obs": np.zeros((n, 4), np.float32), "action": np.ones(n, np.int64),
        "reward": np.ones(n, np.float32), "next_obs": np.zeros((n, 4), np.float32),
        "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
        "env_index": np.zeros(n, np.int32),
    }  # fmt: skip
    header = {"run": run_id, "chunk": 0, "worker": "w", "policy_version": 0}
    bad_action = {**good, "action": np.full(n, 7, np.int64)}
    nan_obs = {**good, "obs": np.full((n, 4), np.nan, np.float32)}
    entries = [
        {b"junk": b"1"},
        encode_chunk({**header, "run": "someone-else"}, good),
        encode_chunk({**header, "chunk": 1}, bad_action),
        encode_chunk({**header, "chunk": 2}, nan_obs),
        encode_chunk({**header, "chunk": "three"}, good),
        encode_chunk(header, good),
    ]
    for fields in entries:
        client.xadd(keys.stream, fields)
    accepted: list[int] = []
    while reader.stats.chunks + reader.stats.rejected < len(entries):
        reader.poll(lambda h, a: accepted.append(h["chunk"]))
    assert accepted == [0]
    assert reader.stats.rejected == 5
    reasons = " | ".join(reader.stats.rejected_reasons)
    for part in (
        "missing header",
        "foreign run",
        "action outside",
        "non-finite",
        "'chunk' must be",
    ):
        assert part in reasons


class Frames(gym.Env):
    """uint8 frames of 10x10x4 (a MinAtar-sized observation), three actions, episodes of 5 steps."""

    observation_space = gym.spaces.Box(0, 255, (10, 10, 4), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        return self._frame(), 1.0, self.t >= 5, False, {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (10, 10, 4), dtype=np.uint8)


def read_all(reader: StreamReader, entries: int) -> list[dict[str, np.ndarray]]:
    got: list[dict[str, np.ndarray]] = []
    deadline = time.monotonic() + 10
    while reader.stats.chunks + reader.stats.rejected < entries:
        assert time.monotonic() < deadline, reader.stats
        reader.poll(lambda h, a: got.append(a))
    return got


def test_uint8_frames_travel_as_uint8_of_their_shape(client, run_id):
    """Actor buffers, stream entry and reader all follow the env's spaces: no float32, no flattening."""
    envs = gym.vector.SyncVectorEnv(
        [Frames, Frames], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )
    chunk = Actor(envs, seeds=[0, 1]).collect(lambda obs: (np.full(len(obs), 2), {}), steps=8)
    envs.close()
    keys = RunKeys(run_id)
    header = {"run": run_id, "chunk": 0, "worker": "w", "policy_version": 0}
    StreamWriter(client, keys).write(header, chunk.arrays)
    spaces = SpaceSpecs.of(Frames.observation_space, Frames.action_space)  # as the learner does
    (arrays,) = read_all(StreamReader(connect(url_of(client), blocking=True), keys, spaces), 1)
    for name in ("obs", "next_obs"):
        assert arrays[name].dtype == np.uint8 and arrays[name].shape == (14, 10, 10, 4)
        np.testing.assert_array_equal(arrays[name], chunk.arrays[name])
    assert arrays["action"].dtype == np.int64 and (arrays["action"] == 2).all()


def test_an_action_outside_the_discrete_range_is_refused_by_name(client, run_id):
    keys = RunKeys(run_id)
    frames = np.zeros((2, 10, 10, 4), np.uint8)
    arrays = {
        "obs": frames, "action": np.array([0, 3]), "reward": np.ones(2, np.float32),
        "next_obs": frames, "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool),
        "env_index": np.zeros(2, np.int32),
    }  # fmt: skip
    header = {"run": run_id, "chunk": 0, "worker": "w", "policy_version": 0}
    StreamWriter(client, keys).write(header, arrays)
    spaces = SpaceSpecs.of(Frames.observation_space, Frames.action_space)
    reader = StreamReader(connect(url_of(client), blocking=True), keys, spaces)
    assert read_all(reader, 1) == []
    assert reader.stats.rejected_reasons == {"action outside [0, 3)": 1}


def test_box_actions_travel_as_float32_and_out_of_bounds_or_nan_ones_are_refused_by_name(
    client, run_id
):
    """Pendulum's actions (float32 in [-2, 2]) with PPO's extra columns: a good chunk arrives as
    sent; one with an action past the bound, one with a NaN action, one with an action of the wrong
    shape are each refused by name and counted, and the good one is not lost."""
    env = gym.make("Pendulum-v1")
    spaces = SpaceSpecs.of(env.observation_space, env.action_space)
    extra = {"logp": ArraySpec("<f4", ()), "pre_squash": ArraySpec("<f4", (1,))}
    n, keys = 4, RunKeys(run_id)
    obs = np.zeros((n, 3), np.float32)
    good = {
        "obs": obs, "action": np.array([[-2.0], [0.5], [1.9], [2.0]], np.float32),
        "reward": np.ones(n, np.float32), "next_obs": obs, "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool), "env_index": np.zeros(n, np.int32),
        "logp": np.zeros(n, np.float32), "pre_squash": np.zeros((n, 1), np.float32),
    }  # fmt: skip
    header = {"run": run_id, "chunk": 0, "worker": "w", "policy_version": 0}
    writer = StreamWriter(client, keys)
    bad = [{"action": np.full((n, 1), 2.5, np.float32)}, {"action": np.full((n, 1), np.nan, np.float32)},
           {"action": np.zeros((n, 2), np.float32)}]  # fmt: skip
    for i, change in enumerate(bad):
        writer.write({**header, "chunk": i + 1}, {**good, **change})
    writer.write(header, good)
    reader = StreamReader(connect(url_of(client), blocking=True), keys, spaces, extra)
    (arrays,) = read_all(reader, 4)
    assert arrays["action"].dtype == np.float32 and arrays["action"].shape == (n, 1)
    np.testing.assert_array_equal(arrays["action"], good["action"])
    reasons = reader.stats.rejected_reasons
    assert reasons.pop("action outside the Box bounds [-2.0, 2.0]") == 1
    assert reasons.pop("action is NaN or infinite") == 1
    assert len(reasons) == 1 and "action" in next(iter(reasons))  # the shape, named by the codec


def test_stacked_frames_travel_once_each_and_a_bad_index_is_refused_by_name(client, run_id):
    """84 x 84 frames in stacks of 4 (Atari's shape): the stream carries each frame once, the
    reader hands the learner the frames and the indexes that rebuild every observation."""
    stacks = [lambda: gym.wrappers.FrameStackObservation(AtariSized(), 4) for _ in range(2)]
    envs = gym.vector.SyncVectorEnv(stacks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    actor = Actor(envs, seeds=[0, 1])
    chunk = actor.collect(lambda obs: (np.zeros(len(obs), np.int64), {}), steps=32)
    envs.close()
    keys = RunKeys(run_id)
    writer, header = StreamWriter(client, keys), {"run": run_id, "worker": "w", "policy_version": 0}
    wire = writer.write({**header, "chunk": 0}, chunk.arrays)
    rows = len(chunk.arrays["action"])
    # About one 7,056-byte frame per transition: the stacks' first frames, one per step, and a
    # new episode's stack whole (episodes of 10 steps here).
    assert wire / rows < 1.3 * 84 * 84, wire / rows
    broken = dict(chunk.arrays, obs_frames=chunk.arrays["obs_frames"] + 10_000)
    writer.write({**header, "chunk": 1}, broken)
    reader = StreamReader(connect(url_of(client), blocking=True), keys, actor.spaces)
    (arrays,) = read_all(reader, 2)
    assert arrays["frames"].dtype == np.uint8 and arrays["frames"].shape[1:] == (84, 84)
    for name, array in chunk.arrays.items():
        np.testing.assert_array_equal(arrays[name], array, err_msg=name)
    assert reader.stats.rejected_reasons == {
        f"array 'obs_frames': indexes outside the chunk's {len(chunk.arrays['frames'])} frames": 1
    }


class AtariSized(Frames):
    """84 x 84 uint8 frames, episodes of 10 steps."""

    observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)

    def step(self, action):
        self.t += 1
        return self._frame(), 1.0, self.t >= 10, False, {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (84, 84), dtype=np.uint8)


@pytest.mark.parametrize(
    "bad",
    [{"num_envs": 0}, {"behaviour": {"kind": "epsilon_greedy", "epsilon": 2.0}}, {"surprise": 1}],
)
def test_bad_chunk_requests_are_refused(bad):
    data = ChunkRequest("r", 0, "CartPole-v1", 2, 5, 1, EpsilonGreedy(0.1)).to_json() | bad
    with pytest.raises((ValueError, TypeError)):
        ChunkRequest.from_json(data)


def test_a_stop_between_a_tasks_chunks_ends_the_task_there(client, run_id):
    """The stop key is checked before every chunk of a task, not only before its first."""
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(POLICY)
    runtime = WorkerRuntime(client, "w:1")
    req = ChunkRequest(
        run_id, 10, "CartPole-v1", 2, 5, seed=5, behaviour=EpsilonGreedy(0.0), chunks=4
    )
    writer = StreamWriter(client, keys)

    class StopAfterTwo:  # the learner ends the run while the task's second chunk is written
        def write(self, header, arrays):
            if header["chunk"] == 11:
                client.set(keys.stop, 1)
            return writer.write(header, arrays)

    first = runtime.run_chunk(
        ChunkRequest(run_id, 0, "CartPole-v1", 2, 5, seed=5, behaviour=EpsilonGreedy(0.0))
    )
    assert first["chunks_done"] == 1 and client.xlen(keys.stream) == 1
    runtime.runs.get(run_id).writer = StopAfterTwo()
    summary = runtime.run_chunk(req)
    assert summary["skipped"] == "run stopped"
    assert (summary["chunk"], summary["chunks"], summary["chunks_done"]) == (10, 4, 2)
    assert summary["steps"] == 2 * 2 * 5
    assert client.xlen(keys.stream) == 3 and run_id not in runtime.runs


def test_a_tasks_chunks_are_stored_when_it_returns_at_one_round_trip_each(
    client, run_id, monkeypatch
):
    """A chunk's XADD goes out with the next chunk's sync check, and the task's last one before
    the task returns: a task of K chunks costs K + 1 round trips to the broker, not 2K."""
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(POLICY)
    runtime = WorkerRuntime(client, "w:1")

    def request(chunk_id: int, chunks: int) -> ChunkRequest:
        return ChunkRequest(run_id, chunk_id, "CartPole-v1", 2, 5, seed=5, behaviour=EpsilonGreedy(0.0),
                            sync="on-change", chunks=chunks)  # fmt: skip

    runtime.run_chunk(request(0, 1))  # builds the envs and fetches the weights
    assert client.xlen(keys.stream) == 1
    sends: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):
        if check_health:  # not a health-check PING of its own
            sends.append(command)
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    summary = runtime.run_chunk(request(1, 4))
    monkeypatch.undo()
    assert summary["chunks_done"] == 4 and client.xlen(keys.stream) == 5
    assert len(sends) == 4 + 1, f"{len(sends)} round trips for a task of 4 chunks"


def test_a_task_notes_its_worker_as_the_taker_of_its_chunks_in_its_first_round_trip(client, run_id):
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(POLICY)
    runtime = WorkerRuntime(client, "w-3@host:4242")  # a worker's name: registry name, pid
    req = ChunkRequest(run_id, 5, "CartPole-v1", 2, 5, seed=5, behaviour=EpsilonGreedy(0.0),
                       chunks=3)  # fmt: skip
    assert runtime.run_chunk(req)["chunks_done"] == 3
    taken = RedisChunkTakers(client, keys).takers([4, 5, 6, 7, 8])
    assert taken == {5: "w-3@host", 6: "w-3@host", 7: "w-3@host"}


def test_a_worker_that_is_shutting_down_cuts_its_chunk_and_starts_no_other(client, run_id):
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(POLICY)
    looks = iter(range(1000))
    # Shutting down from the 5th look on: the task's loop looks once, the actor before each step.
    runtime = WorkerRuntime(client, "w:1", stopping=lambda: next(looks) >= 4)
    req = ChunkRequest(run_id, 0, "CartPole-v1", 2, 10, seed=5, behaviour=EpsilonGreedy(0.0),
                       chunks=3)  # fmt: skip
    summary = runtime.run_chunk(req)
    assert summary["chunks_done"] == 1 and summary["preempted"] and summary["steps"] == 2 * 3
    entries = client.xrange(keys.stream)
    assert len(entries) == 1 and b'"preempted":true' in entries[0][1][b"header"]
