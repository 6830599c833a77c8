"""RunCache and collect_chunk with fakes for the weight client and the writer (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from clusterenv.pipeline.behaviour import Categorical, EpsilonGreedy
from clusterenv.pipeline.chunks.actor import Actor, env_seeds, make_vector_env
from clusterenv.pipeline.chunks.request import ChunkRequest
from clusterenv.pipeline.chunks.runtime import RunCache, RunState, collect_chunk, merge_summaries
from clusterenv.pipeline.policy import NumpyMLP, log_softmax, sample_categorical
from tests.fakes import FakeActor, FakeSlots, FakeWeightClient, FakeWriter, net


def fake_state(version: int = 0) -> RunState:
    return RunState(
        actor=FakeActor(),
        weights=FakeWeightClient(net(0), version=version),
        writer=FakeWriter(),
        actor_index=0,
        slots=FakeSlots(),
        slot=0,
        rng=np.random.default_rng(0),
    )


def test_run_cache_evicts_and_closes_the_least_recently_used_run():
    cache = RunCache(2)
    a, b, c = fake_state(), fake_state(), fake_state()
    cache.put("a", a)
    cache.put("b", b)
    assert cache.get("a") is a  # a is now the most recently used
    cache.put("c", c)
    assert "b" not in cache and "a" in cache and "c" in cache and len(cache) == 2
    assert b.actor.closed == 1 and a.actor.closed == 0 and c.actor.closed == 0
    assert b.slots.released == 1 and a.slots.released == 0  # an evicted run's slot goes back
    assert cache.get("b") is None


def test_run_cache_without_get_evicts_in_insertion_order():
    cache = RunCache(2)
    states = {name: fake_state() for name in "abc"}
    for name, state in states.items():
        cache.put(name, state)
    assert "a" not in cache and states["a"].actor.closed == 1
    assert states["b"].actor.closed == 0


def test_run_cache_put_again_refreshes_without_closing():
    cache = RunCache(2)
    a, b = fake_state(), fake_state()
    cache.put("a", a)
    cache.put("b", b)
    cache.put("a", a)
    cache.put("c", fake_state())
    assert "b" not in cache and "a" in cache and a.actor.closed == 0


def test_run_cache_drop_closes_once():
    cache = RunCache(3)
    a = fake_state()
    cache.put("a", a)
    cache.drop("a")
    assert "a" not in cache and len(cache) == 0 and a.actor.closed == 1
    cache.drop("a")  # unknown run: nothing to close
    assert a.actor.closed == 1


@pytest.mark.parametrize("size", [0, -1])
def test_run_cache_needs_room_for_one_run(size):
    with pytest.raises(ValueError, match="at least one run"):
        RunCache(size)


def cartpole_state(weights: FakeWeightClient, writer: FakeWriter, num_envs: int) -> RunState:
    seeds = env_seeds(1, 3, num_envs)
    return RunState(
        actor=Actor(
            make_vector_env("CartPole-v1", {"max_episode_steps": 10}, num_envs, training=True),
            seeds,
        ),
        weights=weights,
        writer=writer,
        actor_index=3,
        slots=FakeSlots(2),
        slot=2,
        rng=np.random.default_rng(seeds[0]),
    )


def test_collect_chunk_writes_a_header_and_returns_the_summary():
    weights = FakeWeightClient(net(0), version=7, divergence=0.25)
    writer = FakeWriter()
    state = cartpole_state(weights, writer, num_envs=2)
    req = ChunkRequest(
        "run-x", 11, "CartPole-v1", 2, 15, seed=1, behaviour=EpsilonGreedy(0.0), sync="aps:0.25"
    )
    summary = collect_chunk(state, req, 11, "w1:42")
    state.close()

    assert weights.syncs == [EpsilonGreedy(0.0)]  # one sync check per chunk, with its behaviour
    assert weights.steps_since_fetch == 30  # env steps recorded for interval rules
    assert len(writer.written) == 1
    header, arrays = writer.written[0]
    rows = len(arrays["action"])
    assert header == {
        "run": "run-x",
        "chunk": 11,
        "worker": "w1:42",
        "actor": 3,
        "slot": 2,
        "policy_version": 7,
        "divergence": 0.25,
        "env_steps": 30,
        "episodes": header["episodes"],
        "sync": {"version_checks": 1, "weight_fetches": 0, "weight_bytes": 0},
    }
    # 15 steps, episodes of at most 10: each env finished one; none on the chunk's last step,
    # so every finished episode's reset step was dropped here.
    assert len(header["episodes"]) >= 2 and rows == 30 - len(header["episodes"])
    assert sum(length for _, length in header["episodes"]) <= rows
    # ε = 0: every action is the greedy one of the policy the client returned.
    greedy = NumpyMLP(net(0))(arrays["obs"]).argmax(axis=1)
    np.testing.assert_array_equal(arrays["action"], greedy)
    assert summary == {
        "chunk": 11,
        "worker": "w1:42",
        "steps": 30,
        "transitions": rows,
        "episodes_finished": len(header["episodes"]),
        "policy_version": 7,
        "bytes": sum(a.nbytes for a in arrays.values()),
        "version_checks": 1,
        "weight_fetches": 0,
        "weight_bytes": 0,
    }


def test_collect_chunk_explores_with_epsilon_one():
    weights, writer = FakeWeightClient(net(0)), FakeWriter()
    state = cartpole_state(weights, writer, num_envs=4)
    req = ChunkRequest("run-x", 0, "CartPole-v1", 4, 25, seed=1, behaviour=EpsilonGreedy(1.0))
    collect_chunk(state, req, 0, "w")
    state.close()
    _, arrays = writer.written[0]
    greedy = NumpyMLP(net(0))(arrays["obs"]).argmax(axis=1)
    assert 0.3 < float((arrays["action"] != greedy).mean()) < 0.7  # uniform: half disagree
    assert weights.syncs == [EpsilonGreedy(1.0)]


def test_collect_chunk_reports_each_chunk_of_a_run():
    weights, writer = FakeWeightClient(net(0), version=2), FakeWriter()
    state = cartpole_state(weights, writer, num_envs=2)
    for chunk_id in range(3):
        req = ChunkRequest(
            "run-x", chunk_id, "CartPole-v1", 2, 4, seed=1, behaviour=EpsilonGreedy(0.1)
        )
        assert collect_chunk(state, req, chunk_id, "w")["chunk"] == chunk_id
    state.close()
    assert [h["chunk"] for h, _ in writer.written] == [0, 1, 2]
    assert [h["sync"]["version_checks"] for h, _ in writer.written] == [1, 2, 3]
    assert weights.steps_since_fetch == 3 * 8


def test_merge_summaries_sums_a_tasks_chunks_and_keeps_the_last_counters():
    req = ChunkRequest(
        "run-x", 8, "CartPole-v1", 2, 4, seed=1, behaviour=EpsilonGreedy(0.1), chunks=3
    )
    done = [
        {"chunk": 8 + i, "worker": "w", "steps": 8, "transitions": 7 + i, "episodes_finished": i,
         "policy_version": i, "bytes": 100, "version_checks": i + 1}
        for i in range(2)
    ]  # fmt: skip
    merged = merge_summaries(req, done)
    assert merged == {
        "chunk": 8, "chunks": 3, "chunks_done": 2, "worker": "w", "steps": 16, "transitions": 15,
        "episodes_finished": 1, "policy_version": 1, "bytes": 200, "version_checks": 2,
        "env_errors": 0,
    }  # fmt: skip
    assert merge_summaries(req, [])["chunks_done"] == 0


def test_collect_chunk_samples_the_categorical_policy_and_records_its_log_probs():
    weights, writer = FakeWeightClient(net(0)), FakeWriter()
    state = cartpole_state(weights, writer, num_envs=4)
    req = ChunkRequest("run-x", 0, "CartPole-v1", 4, 50, seed=1, behaviour=Categorical())
    collect_chunk(state, req, 0, "w")
    state.close()
    _, arrays = writer.written[0]
    logp = log_softmax(NumpyMLP(net(0))(arrays["obs"]))
    rows = np.arange(len(arrays["action"]))
    np.testing.assert_allclose(arrays["logp"], logp[rows, arrays["action"]], rtol=1e-5)
    assert arrays["logp"].dtype == np.float32 and len(arrays["logp"]) == len(arrays["obs"])
    # Sampled, not greedy: some actions are not the argmax even with epsilon 0.
    assert (arrays["action"] != logp.argmax(axis=1)).any()


def test_sample_categorical_follows_the_softmax():
    logits = np.tile(np.array([[0.0, np.log(3.0), -50.0]], np.float32), (20_000, 1))
    actions, logp = sample_categorical(logits, np.random.default_rng(0))
    freq = np.bincount(actions, minlength=3) / len(actions)
    np.testing.assert_allclose(freq, [0.25, 0.75, 0.0], atol=0.015)
    np.testing.assert_allclose(logp[actions == 1], np.log(0.75), rtol=1e-5)


def brute_force_priorities(arrays: dict, policy, n: int, gamma: float) -> np.ndarray:
    """Each row's |n-step TD error|, one row at a time: its env's next rows up to n, stopped at
    an episode's end or the env's last row; the bootstrap from the window's last next_obs."""
    out = np.zeros(len(arrays["action"]))
    for i in range(len(out)):
        env_rows = np.flatnonzero(arrays["env_index"] == arrays["env_index"][i])
        window = [i]
        for j in env_rows[env_rows > i]:
            tail = window[-1]
            if len(window) == n or arrays["terminated"][tail] or arrays["truncated"][tail]:
                break
            window.append(j)
        ret = sum(gamma**k * float(arrays["reward"][r]) for k, r in enumerate(window))
        tail = window[-1]
        boot = 0.0 if arrays["terminated"][tail] else policy(arrays["next_obs"][[tail]]).max()
        q = policy(arrays["obs"][[i]])[0, arrays["action"][i]]
        out[i] = abs(ret + gamma ** len(window) * boot - q)
    return out


@pytest.mark.parametrize("n", [1, 3])
def test_worker_priorities_equal_each_rows_n_step_td_error_under_the_workers_network(n):
    """collect_chunk with priority_n_step: the chunk carries `priority` (not the Q columns acting
    kept) equal to a row-by-row computation, across terminations, time limits and chunk ends."""
    weights, writer = FakeWeightClient(net(0)), FakeWriter()
    state = cartpole_state(weights, writer, num_envs=3)
    req = ChunkRequest("run-x", 0, "CartPole-v1", 3, 40, seed=1, behaviour=EpsilonGreedy(0.3),
                       priority_n_step=n, priority_gamma=0.9)  # fmt: skip
    collect_chunk(state, req, 0, "w")
    state.close()
    _, arrays = writer.written[0]
    assert "priority" in arrays and not {"q_taken", "q_max"} & set(arrays)
    assert arrays["terminated"].any() and arrays["truncated"].any()  # episodes of at most 10
    expected = brute_force_priorities(arrays, NumpyMLP(net(0)), n, 0.9)
    np.testing.assert_allclose(arrays["priority"], expected, rtol=1e-4, atol=1e-5)
