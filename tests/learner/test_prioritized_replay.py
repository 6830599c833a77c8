"""Prioritized replay (learner/replay/priorities.py): the sum tree, sampling in proportion to
priorities, importance weights, and the learner's use of them. Pure logic, no server."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.replay.frames import FrameReplay
from clusterenv.learner.replay.priorities import Prioritized, SumTree
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from tests.learner.test_replay_and_limiter import rows, stacked_chunks


def test_the_tree_keeps_its_sums_and_smallest_leaf_through_batched_updates():
    rng = np.random.default_rng(0)
    tree, leaves = SumTree(1000, block=16), np.zeros(1000)
    for step in range(50):
        idx = rng.integers(1000, size=64)  # repeats included
        values = rng.random(64) * 10 * (1 + step)  # growing: the keys' scale is raised on the way
        tree.set(idx, values)
        leaves[idx] = tree.get(idx)  # a repeated index keeps one of its values
        assert set(tree.get(idx)) <= set(values)
        assert tree.total == pytest.approx(leaves.sum(), rel=1e-12)
        assert tree.min == leaves[leaves > 0].min()
        # Every block's sum and smallest leaf; keys that never decrease, each its block's offset
        # plus the running sum of its block.
        padded = np.zeros(tree.leaves.shape)  # 63 blocks of 16: the last one half padding
        padded[:1000] = leaves
        blocks = padded.reshape(-1, 16)
        np.testing.assert_allclose(tree.block_sums, blocks.sum(axis=1), rtol=1e-12)
        assert np.all(np.diff(tree.keys) >= 0)
        expected = np.arange(len(blocks))[:, None] * tree.scale + np.cumsum(blocks, axis=1)
        np.testing.assert_allclose(tree.keys, expected.ravel(), rtol=1e-12)
    tree.set(np.arange(1000), np.zeros(1000))
    assert tree.total == 0.0 and tree.min == np.inf


def test_the_tree_finds_the_leaf_a_running_sum_gives_and_never_an_empty_one():
    """find() against np.searchsorted over the leaves' cumulative sums, on 44 blocks with a third
    of the leaves empty (rows never stored or forgotten); a prefix at the very total, which
    rounding makes possible, lands on the last non-empty leaf, not on padding."""
    rng = np.random.default_rng(5)
    tree = SumTree(700, block=16)
    leaves = rng.random(700) * (rng.random(700) > 0.33)
    tree.set(np.arange(700), leaves)
    prefix = rng.random(5000) * tree.total
    expected = np.searchsorted(np.cumsum(leaves), prefix, side="right")
    found = tree.find(prefix)
    assert np.mean(found == expected) > 0.999  # a prefix within rounding of a boundary may differ
    assert np.all(leaves[found] > 0)
    assert tree.find(np.array([0.0]))[0] == np.flatnonzero(leaves)[0]
    assert tree.find(np.array([tree.total]))[0] == np.flatnonzero(leaves)[-1]


def test_rows_are_drawn_in_proportion_to_their_priorities():
    """10 rows with priorities 1..10 (alpha 1): 200,000 stratified draws match P(i) = p_i / sum
    within 4 standard errors each, and a chi-square test does not reject (fixed seed)."""
    sampler, rng = Prioritized(16, alpha=1.0, beta=0.4, eps=0.0), np.random.default_rng(3)
    priorities = np.arange(1.0, 11.0)
    sampler.update(np.arange(10), priorities)
    draws = np.concatenate([sampler.sample(10, 64, rng) for _ in range(3125)])
    counts, n = np.bincount(draws, minlength=16), len(draws)
    expected = priorities / priorities.sum()
    assert counts[10:].sum() == 0  # never a row not stored
    se = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(counts[:10] / n - expected) < 4 * se)
    chi2 = ((counts[:10] - n * expected) ** 2 / (n * expected)).sum()
    assert chi2 < 21.67  # the 99th percentile of chi-square with 9 degrees of freedom


def test_importance_weights_are_normalized_by_the_largest_any_stored_row_gets():
    """w_i = (N P(i)) ** -beta / max_j w_j, the max over stored rows (the paper's 1 / max_i w_i):
    the row of smallest priority weighs 1 and the others less."""
    sampler = Prioritized(8, alpha=0.5, beta=0.7)
    td = np.array([0.1, 2.0, 0.5, 4.0, 1.0])
    sampler.update(np.arange(5), td)
    p = (np.abs(td) + 1e-6) ** 0.5
    prob, n = p / p.sum(), 5
    w = (n * prob) ** -0.7
    np.testing.assert_allclose(sampler.weights_of(np.arange(5)), w / w.max(), rtol=1e-6)
    assert sampler.weights_of(np.array([0]))[0] == pytest.approx(1.0)


def test_a_new_row_gets_the_largest_priority_so_far():
    rb = ReplayBuffer(10, (2,), np.float32, sampler=Prioritized(10, alpha=1.0, beta=0.4))
    rb.add(*rows(0, 4))
    batch = rb.sample(4, np.random.default_rng(0))
    rb.update_priorities(batch, np.full(4, 3.0) * (np.arange(4) + 1))
    rb.add(*rows(4, 2))
    leaves = rb.sampler.tree.get(np.arange(6))
    assert leaves[4] == leaves[5] == pytest.approx(leaves.max())


def test_a_row_a_worker_sent_with_its_td_error_starts_at_that_priority():
    """Ape-X's initial priorities (`--initial-priority worker`): the chunk's `priority` column
    becomes (|delta| + eps) ** alpha, also in the frame replay; the largest so far follows it."""
    sampler = Prioritized(16, alpha=0.5, beta=0.4, eps=0.0)
    rb = ReplayBuffer(16, (2,), np.float32, sampler=sampler)
    obs, action, reward, next_obs, terminated = rows(0, 4)
    td = np.array([0.25, 4.0, 1.0, 9.0], np.float32)
    rb.insert({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
               "terminated": terminated, "priority": td})  # fmt: skip
    np.testing.assert_allclose(sampler.tree.get(np.arange(4)), [0.5, 2.0, 1.0, 3.0])
    assert sampler.max_priority == 3.0
    chunks, spaces = stacked_chunks(1, 2)
    chunk = chunks[0][0]
    assert len(chunk["action"]) == 4  # two envs x two steps
    frames = FrameReplay(64, 4, spaces.frame, spaces.action.array,
                         sampler=Prioritized(64, 0.5, 0.4, 0.0))  # fmt: skip
    frames.insert(chunk | {"priority": td})
    np.testing.assert_allclose(frames.sampler.tree.get(np.arange(4)), [0.5, 2.0, 1.0, 3.0])


def test_a_priority_for_a_row_overwritten_since_it_was_sampled_is_dropped():
    """The ingest thread may overwrite a sampled row before the learner's update comes back: the
    new transition there keeps its own (largest) priority, not the old row's TD error."""
    rb = ReplayBuffer(4, (2,), np.float32, sampler=Prioritized(4, alpha=1.0, beta=0.4))
    rb.add(*rows(0, 4))
    batch = rb.sample(64, np.random.default_rng(1))
    rb.add(*rows(4, 2))  # rows 0 and 1 now hold new transitions
    rb.update_priorities(batch, np.full(64, 1e-3))
    leaves = rb.sampler.tree.get(np.arange(4))
    assert leaves[0] == leaves[1] == 1.0  # the largest so far: untouched
    assert np.allclose(leaves[2:], 1e-3 + 1e-6)


def test_frame_replay_samples_by_priority_and_forgets_rows_whose_frames_are_gone():
    # 2,000 rows of ~1.16 frames each: the frame ring's slack runs out, the oldest rows die.
    chunks, spaces = stacked_chunks(40, 64, seed=3)
    replay = FrameReplay(2000, 4, spaces.frame, spaces.action.array,
                         Prioritized(2000, alpha=1.0, beta=0.4))  # fmt: skip
    for compact, _ in chunks:
        replay.insert(compact)
    whole = np.concatenate([w["obs"] for _, w in chunks])
    newest = {obs.tobytes() for obs in whole[-replay.size :]}  # the stacks the env made
    rng = np.random.default_rng(1)
    for _ in range(20):  # every dead row drawn at least once (but for odds of 1e-8 a row)
        batch = replay.sample(512, rng)
        assert len(batch["obs"]) == 512 and batch["weight"].shape == (512,)
        assert all(obs.tobytes() in newest for obs in batch["obs"])
    dead = ~replay._alive(np.arange(replay.size))
    assert dead.any() and np.all(replay.sampler.tree.get(np.flatnonzero(dead)) == 0.0)
    np.testing.assert_array_equal(batch["weight"], replay.sampler.weights_of(batch["index"]))


def learner(cfg: DQNConfig, replay: ReplayBuffer, seed: int = 0) -> DQNLearner:
    return DQNLearner((2,), 2, cfg, replay, RateLimiter(1e9, 8, 1e9), seed, total_steps=1000)


def test_importance_weights_scale_each_rows_gradient():
    """The update's gradient with every weight 0.25 is a quarter of the unweighted one (before
    clipping, which a small batch stays under)."""
    cfg = DQNConfig(hidden="8", batch_size=8, learning_starts=8, max_grad_norm=1e9)
    rb = ReplayBuffer(16, (2,), np.float32)
    rb.add(*rows(0, 16))
    batch = {k: v for k, v in rb.sample(8, np.random.default_rng(0)).items()}
    plain, weighted = learner(cfg, rb), learner(cfg, rb)
    plain.update(batch)
    weighted.update(batch | {"weight": np.full(8, 0.25, np.float32)})
    torch.testing.assert_close(weighted._grads, plain._grads * 0.25)
    torch.testing.assert_close(weighted.last_td_errors, plain.last_td_errors)


def test_the_learner_updates_priorities_and_anneals_beta_to_one():
    cfg = DQNConfig(hidden="8", batch_size=8, learning_starts=8, prioritized=True,
                    priority_alpha=1.0, priority_beta=0.4)  # fmt: skip
    sampler = Prioritized(32, cfg.priority_alpha, cfg.priority_beta)
    rb = ReplayBuffer(32, (2,), np.float32, sampler=sampler)
    rb.add(*rows(0, 32))
    dqn = learner(cfg, rb)
    dqn.limiter.on_insert(32)
    assert dqn.step()
    changed = sampler.tree.get(np.arange(32)) != 1.0
    assert changed.any()  # the sampled rows' priorities are their |TD error| now
    dqn.collected(500)
    assert sampler.beta == pytest.approx(0.7)
    dqn.collected(1000)
    assert sampler.beta == 1.0


def test_a_checkpoint_keeps_the_priorities():
    cfg = DQNConfig(hidden="8", batch_size=8, learning_starts=8, prioritized=True)
    make = lambda: ReplayBuffer(32, (2,), np.float32, sampler=Prioritized(32, 0.6, 0.4))  # noqa: E731
    a = learner(dataclasses.replace(cfg), make())
    a.save_replay = True
    a.replay.add(*rows(0, 20))
    a.limiter.on_insert(20)
    for _ in range(5):
        a.step()
    arrays, values = a.save()
    b = learner(cfg, make(), seed=9)
    b.restore(arrays, values)
    np.testing.assert_array_equal(
        b.replay.sampler.tree.get(np.arange(32)), a.replay.sampler.tree.get(np.arange(32))
    )
    assert b.replay.sampler.max_priority == a.replay.sampler.max_priority
    # A uniform run's checkpoint gives every stored row the largest priority.
    c = learner(cfg, make(), seed=9)
    c.restore({k: v for k, v in arrays.items() if k != "replay.priority"},
              {**values, "replay": {**values["replay"], "sampler": {}}})  # fmt: skip
    assert np.all(c.replay.sampler.tree.get(np.arange(20)) == 1.0)


def test_bad_priority_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="--priority-alpha"):
        DQNConfig(priority_alpha=1.5).validate()
    with pytest.raises(ValueError, match="--priority-beta"):
        DQNConfig(priority_beta=-0.1).validate()
