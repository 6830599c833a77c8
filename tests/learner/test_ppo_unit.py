"""PPO on chunks, pure logic: the behaviour-policy ratio, GAE at episode ends, the max-lag drop."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.policies import CategoricalPolicy
from clusterenv.learner.ppo.config import PPOConfig
from clusterenv.learner.ppo.learning import PPOLearner, QueuedChunk
from clusterenv.learner.ppo.loss import gae, ppo_loss
from clusterenv.learner.replay.rate_limiter import RateLimiter


def test_ratio_is_taken_against_the_behaviour_log_probs():
    cfg = PPOConfig(
        norm_adv=False, clip_coef=0.2, ent_coef=0.0, vf_coef=0.0, clip_center="behaviour"
    )
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]])  # π_θ: ½, ¾, ½
    action = torch.tensor([0, 0, 1])
    # The worker acted with an older policy: π_b(a|s) = 0.4, 0.5, 0.8, not π_θ's 0.5, 0.75, 0.5.
    behaviour = torch.tensor([0.4, 0.5, 0.8]).log()
    adv = torch.tensor([1.0, 1.0, -2.0])
    mb = {"action": action, "logp": behaviour, "advantages": adv,
          "values": torch.zeros(3), "returns": torch.zeros(3)}  # fmt: skip
    parts = ppo_loss(logits, torch.zeros(3), mb, cfg, CategoricalPolicy(logits.shape[1]))
    ratio = np.array([0.5 / 0.4, 0.75 / 0.5, 0.5 / 0.8])  # 1.25, 1.5, 0.625
    clipped = ratio.clip(0.8, 1.2)
    a = adv.numpy()
    expected = np.maximum(-a * ratio, -a * clipped).mean()
    assert parts.policy_loss == pytest.approx(expected, rel=1e-5)
    # Against the learner's own policy every ratio would be 1 and the loss -mean(A) = 0: not it.
    assert parts.policy_loss != pytest.approx(float(-adv.mean()), abs=1e-3)
    assert parts.clipfrac == pytest.approx(1.0)  # all three ratios lie outside [0.8, 1.2]


def test_decoupled_clip_centres_on_the_learner_and_weights_by_the_truncated_behaviour_ratio():
    cfg = PPOConfig(
        norm_adv=False, clip_coef=0.2, ent_coef=0.0, vf_coef=0.0, clip_center="behaviour"
    )
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]])  # π_θ: ½, ¾, ½
    action = torch.tensor([0, 0, 1])
    behaviour = torch.tensor([0.4, 0.5, 0.8])  # the worker's (stale) policy
    learner = torch.tensor([0.45, 0.7, 0.6])  # the learner's policy at the start of the update
    adv = torch.tensor([1.0, 1.0, -2.0])
    mb = {"action": action, "logp": behaviour.log(), "logp_learner": learner.log(),
          "advantages": adv, "values": torch.zeros(3), "returns": torch.zeros(3)}  # fmt: skip
    decoupled = dataclasses.replace(cfg, clip_center="learner")
    parts = ppo_loss(logits, torch.zeros(3), mb, decoupled, CategoricalPolicy(logits.shape[1]))
    ratio = np.array([0.5, 0.75, 0.5]) / learner.numpy()  # 1.11, 1.07, 0.83: inside the clip
    weight = np.minimum(1.0, (learner / behaviour).numpy())  # 1 (1.125 truncated), 1, 0.75
    a = adv.numpy()
    expected = (weight * np.maximum(-a * ratio, -a * ratio.clip(0.8, 1.2))).mean()
    assert parts.policy_loss == pytest.approx(expected, rel=1e-5)
    assert parts.clipfrac == pytest.approx(0.0)  # around the learner no ratio clips
    around_behaviour = ppo_loss(logits, torch.zeros(3), mb, cfg, CategoricalPolicy(logits.shape[1]))
    assert around_behaviour.clipfrac == pytest.approx(1.0)  # around π_b all do
    # Without lag the learner is the behaviour policy: the two objectives agree.
    mb["logp"] = mb["logp_learner"]
    same = ppo_loss(logits, torch.zeros(3), mb, cfg, CategoricalPolicy(logits.shape[1])).policy_loss
    assert parts.policy_loss != pytest.approx(same, rel=1e-3)
    assert ppo_loss(
        logits, torch.zeros(3), mb, decoupled, CategoricalPolicy(logits.shape[1])
    ).policy_loss == pytest.approx(same)


def test_gradient_flows_through_the_clipped_ratio_only_where_it_is_unclipped():
    cfg = PPOConfig(norm_adv=False, ent_coef=0.0, vf_coef=0.0, clip_center="behaviour")
    logits = torch.zeros(2, 2, requires_grad=True)
    mb = {"action": torch.tensor([0, 0]), "logp": torch.tensor([0.5, 0.45]).log(),
          "advantages": torch.tensor([1.0, 1.0]), "values": torch.zeros(2),
          "returns": torch.zeros(2)}  # fmt: skip
    ppo_loss(logits, torch.zeros(2), mb, cfg, CategoricalPolicy(logits.shape[1])).loss.backward()
    # Row 0: ratio 1 (inside the clip range) moves; row 1: ratio 1.11 also inside; both push up a0.
    assert (logits.grad[:, 0] < 0).all()
    mb["logp"] = torch.tensor([0.5, 0.3]).log()  # row 1: ratio 1.67 > 1.2 with A > 0: clipped
    logits.grad = None
    ppo_loss(logits, torch.zeros(2), mb, cfg, CategoricalPolicy(logits.shape[1])).loss.backward()
    assert logits.grad[0, 0] < 0 and logits.grad[1].abs().max() == 0


def test_gae_bootstraps_on_truncation_and_not_on_termination():
    # Two envs interleaved (time-major): env 0 terminates at its 2nd row, env 1 is truncated at
    # its 1st; each env's last row ends the chunk mid-episode.
    env = np.array([0, 1, 0, 1, 0, 1])
    reward = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    value = np.array([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    next_value = np.array([2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    term = np.array([False, False, True, False, False, False])
    trunc = np.array([False, True, False, False, False, False])
    g, lam = 0.9, 0.5
    adv, ret = gae(reward, value, next_value, term, trunc, env, g, lam)
    d = reward + g * next_value * (1 - term) - value  # per-row TD errors
    assert d[2] == pytest.approx(0.5)  # terminated: r - V(s), no bootstrap
    assert d[1] == pytest.approx(1.0 + 0.9 * 3.0 - 0.5)  # truncated: bootstraps on V(final obs)
    want = np.empty(6)
    want[4] = d[4]  # env 0's last row: the chunk's end
    want[2] = d[2]  # terminated: nothing flows back from the next episode
    want[0] = d[0] + g * lam * want[2]
    want[5] = d[5]
    want[3] = d[3] + g * lam * want[5]
    want[1] = d[1]  # truncated: bootstrapped above, and the next episode's advantage stays out
    np.testing.assert_allclose(adv, want)
    np.testing.assert_allclose(ret, want + value)


def test_vtrace_cuts_the_trace_at_each_later_actions_ratio_and_weights_the_targets():
    # One env, four rows, the episode truncated after row 2 (so row 3 starts the next one).
    env = np.zeros(4, dtype=int)
    reward = np.array([1.0, 2.0, 3.0, 4.0])
    value = np.array([0.5, 1.0, 1.5, 2.0])
    next_value = np.array([1.0, 1.5, 9.0, 3.0])
    term = np.zeros(4, dtype=bool)
    trunc = np.array([False, False, True, False])
    rho = np.array([0.5, 0.25, 1.0, 0.1])  # min(1, π/π_b) of each row's action
    g, lam = 0.9, 0.8
    adv, ret = gae(reward, value, next_value, term, trunc, env, g, lam, rho)
    d = reward + g * next_value - value
    want = np.empty(4)
    want[3] = d[3]  # the chunk's end
    want[2] = d[2]  # truncated: bootstraps on V(final obs); the next episode stays out
    want[1] = d[1] + g * lam * rho[2] * want[2]  # row 2's action was π's own (ρ = 1)
    want[0] = d[0] + g * lam * rho[1] * want[1]  # cut to a quarter by row 1's action
    np.testing.assert_allclose(adv, want)
    np.testing.assert_allclose(ret, value + rho * want)  # V-trace's targets v_t
    # Ratios of 1 (chunks that are not stale) give GAE itself.
    ones = gae(reward, value, next_value, term, trunc, env, g, lam, np.ones(4))
    plain = gae(reward, value, next_value, term, trunc, env, g, lam)
    for got, expected in zip(ones, plain, strict=True):
        np.testing.assert_allclose(got, expected)


def test_vtrace_takes_its_ratios_from_the_learners_policy_and_the_behaviour_log_probs():
    cfg = PPOConfig(batch_steps=32, advantages="vtrace", gae_lambda=0.9)
    learner = PPOLearner((4,), CategoricalPolicy(2), cfg, RateLimiter(1.0, 0, 10_000),
                         lambda version: 0, seed=0)  # fmt: skip
    _, arrays = chunk(32, version=0)
    arrays["logp"][::2] = math.log(0.9)  # a stale worker was sure of half its actions
    data = learner._prepare([QueuedChunk(0, arrays)])
    rho = (data["logp_learner"] - data["logp"]).exp().clamp(max=1.0).double().numpy()
    assert rho[::2].max() < 0.6 and rho[1::2].min() > 0.99  # the fresh learner is near ½ each
    value = data["values"].double().numpy()
    with torch.no_grad():
        next_value = learner.critic(torch.as_tensor(arrays["next_obs"])).squeeze(1).double().numpy()
    want_adv, want_ret = gae(arrays["reward"].astype(np.float64), value, next_value,
                             arrays["terminated"], arrays["truncated"], arrays["env_index"],
                             cfg.gamma, cfg.gae_lambda, rho)  # fmt: skip
    np.testing.assert_allclose(data["advantages"].numpy(), want_adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(data["returns"].numpy(), want_ret, rtol=1e-5, atol=1e-6)
    plain = PPOLearner((4,), CategoricalPolicy(2), dataclasses.replace(cfg, advantages="gae"),
                       RateLimiter(1.0, 0, 10_000), lambda version: 0, seed=0)  # fmt: skip
    assert not np.allclose(plain._prepare([QueuedChunk(0, arrays)])["returns"].numpy(),
                           data["returns"].numpy())  # fmt: skip


def chunk(rows: int, version: int, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    arrays = {
        "obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "action": rng.integers(2, size=rows),
        "reward": np.ones(rows, np.float32),
        "next_obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "terminated": np.zeros(rows, bool),
        "truncated": np.zeros(rows, bool),
        "env_index": np.arange(rows, dtype=np.int32) % 2,
        "logp": np.full(rows, math.log(0.5), np.float32),
    }
    return {"policy_version": version}, arrays


def test_a_chunk_past_the_max_lag_is_dropped_and_counted():
    newest = {"v": 10}
    limiter = RateLimiter(1.0, 0, 10_000)
    cfg = PPOConfig(batch_steps=64, max_policy_lag=3, num_minibatches=2, update_epochs=1)
    learner = PPOLearner((4,), CategoricalPolicy(2), cfg, limiter,
                         lambda version: newest["v"] - version, seed=0)  # fmt: skip
    learner.insert(*chunk(32, version=7, seed=2))  # 3 behind: still used
    learner.insert(*chunk(32, version=6, seed=1))  # 4 versions behind: past the max lag
    learner.insert(*chunk(16, version=6, seed=4))  # and another of the same version
    assert not learner.step()  # 80 rows queued, but two chunks are stale: too few left
    assert (learner.dropped_chunks, learner.dropped_rows) == (2, 48)
    assert learner.updates == 0
    learner.insert(*chunk(32, version=9, seed=3))
    assert learner.step()
    assert learner.updates == 1 and learner.dropped_chunks == 2
    assert learner.metrics()["pipeline/stale_chunks_dropped"] == 2
    # The dropped rows are written off in the limiter: collection may replace them.
    assert limiter.inserts == 112 and limiter.samples == 112


def test_the_decoupled_centre_is_the_learners_policy_before_the_update():
    cfg = PPOConfig(batch_steps=32)  # the default centre: the learner
    learner = PPOLearner((4,), CategoricalPolicy(2), cfg, RateLimiter(1.0, 0, 10_000),
                         lambda version: 0, seed=0)  # fmt: skip
    header, arrays = chunk(32, version=0)
    data = learner._prepare([QueuedChunk(0, arrays)])
    logits = learner.actor(torch.as_tensor(arrays["obs"]))
    want = torch.log_softmax(logits, dim=1)[torch.arange(32), torch.as_tensor(arrays["action"])]
    torch.testing.assert_close(data["logp_learner"], want.detach())
    assert not torch.allclose(data["logp_learner"], data["logp"])  # the worker's: log ½ each
    before = [p.detach().clone() for p in learner.actor.parameters()]
    learner.insert(header, arrays)
    assert learner.step()
    assert any(
        not torch.equal(a, b) for a, b in zip(before, learner.actor.parameters(), strict=True)
    )


def test_published_weights_are_the_policy_network_the_workers_read():
    from clusterenv.pipeline.policy import NumpyMLP

    learner = PPOLearner((4,), CategoricalPolicy(3), PPOConfig(), RateLimiter(1.0, 0, 1.0),
                         lambda v: 0, seed=0)  # fmt: skip
    weights = learner.get_weights()
    assert set(weights) == {f"layers.{i}.{p}" for i in range(3) for p in ("weight", "bias")}
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    with torch.no_grad():
        torch_logits = learner.actor(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(NumpyMLP(weights)(obs), torch_logits, rtol=1e-5, atol=1e-6)


def test_save_restores_into_a_fresh_learner():
    def fresh(seed: int) -> PPOLearner:
        return PPOLearner(
            (4,),
            CategoricalPolicy(2),
            PPOConfig(),
            RateLimiter(1.0, 0, 1.0),
            lambda v: 0,
            seed=seed,
        )

    saved, other = fresh(0), fresh(1)
    assert not np.allclose(
        saved.get_weights()["layers.0.weight"], other.get_weights()["layers.0.weight"]
    )
    saved.dropped_chunks, saved.dropped_rows = 2, 48
    other.restore(*saved.save())
    arrays, values = saved.save()
    for name, value in other.save()[0].items():
        np.testing.assert_array_equal(arrays[name], value, err_msg=name)
    assert other.save()[1] == values and (other.dropped_chunks, other.dropped_rows) == (2, 48)


def test_aps_workers_get_a_version_guard_below_the_max_policy_lag():

    from clusterenv.learner.agents import build_agent
    from clusterenv.pipeline.behaviour import Categorical, EpsilonGreedy
    from tests.fakes import CARTPOLE

    cfg = TrainConfig.for_algo("ppo")
    cfg.agent.max_policy_lag = 10
    agent = build_agent(cfg, CARTPOLE, lambda v: 0)
    assert (agent.behaviour(0, 8), agent.max_lag_versions, agent.publish_every) == (
        Categorical(),
        5,
        1,
    )
    assert set(agent.extra_specs) == {"logp"}
    cfg.weights.max_lag_versions = 3  # the user's tighter guard stands
    assert build_agent(cfg, CARTPOLE, lambda v: 0).max_lag_versions == 3
    cfg.weights.sync, cfg.weights.max_lag_versions = "on-change", 0  # no APS: no guard to send
    assert build_agent(cfg, CARTPOLE, lambda v: 0).max_lag_versions == 0
    dqn = build_agent(TrainConfig(), CARTPOLE, lambda v: 0)
    assert (dqn.behaviour(0, 8), dqn.max_lag_versions, dqn.extra_specs) == (
        EpsilonGreedy(1.0),
        0,
        {},
    )
    assert dqn.behaviour(10**9, 8) == EpsilonGreedy(TrainConfig().agent.eps_end)


def test_a_ppo_checkpoint_round_trip_restores_the_networks_and_adam(tmp_path):
    from clusterenv.learner.persistence.checkpoint import Checkpoints
    from clusterenv.learner.persistence.components import gather, scatter

    def fresh(seed: int) -> PPOLearner:
        cfg = PPOConfig(batch_steps=32, num_minibatches=2, update_epochs=2)
        return PPOLearner(
            (4,), CategoricalPolicy(2), cfg, RateLimiter(1.0, 0, 1e6), lambda v: 0, seed=seed
        )

    a = fresh(0)
    for c in range(3):
        a.insert(*chunk(32, version=0, seed=c))
        assert a.step()
    store = Checkpoints(tmp_path, TrainConfig().checkpoint)
    store.save(*gather({"learner": a}), a.updates)
    _, tensors, state = store.newest()
    b = fresh(5)
    scatter({"learner": b}, tensors, state)
    assert b.updates == 3 and b.last_loss == pytest.approx(a.last_loss)
    for learner in (a, b):  # the same data gives the same update: networks, Adam and generator
        learner.insert(*chunk(32, version=0, seed=9))
        assert learner.step()
    for name, value in a.save()[0].items():
        np.testing.assert_array_equal(b.save()[0][name], value, err_msg=name)


def test_a_conv_learner_takes_a_step_on_uint8_frames_and_publishes_its_conv_policy():
    from clusterenv.pipeline.policy import NumpyConvNet

    shape, rows = (4, 84, 84), 16
    cfg = PPOConfig(batch_steps=rows, num_minibatches=2, update_epochs=1)
    learner = PPOLearner(
        shape, CategoricalPolicy(3), cfg, RateLimiter(1.0, 0, 10_000), lambda v: 0, seed=0
    )
    header, arrays = chunk(rows, version=0)
    rng = np.random.default_rng(0)
    arrays["obs"] = rng.integers(0, 256, size=(rows, *shape), dtype=np.uint8)
    arrays["next_obs"] = rng.integers(0, 256, size=(rows, *shape), dtype=np.uint8)
    arrays["action"] = rng.integers(3, size=rows)
    arrays["logp"] = np.full(rows, math.log(1 / 3), np.float32)
    # CleanRL's init: orthogonal, zero biases, the policy's output layer at std 0.01.
    with torch.no_grad():
        assert all(not layer.bias.any() for layer in learner.actor.conv)
        policy_std, value_std = (
            net.layers[-1].weight.std() for net in (learner.actor, learner.critic)
        )
        assert policy_std < 0.01 < value_std
    before = [p.detach().clone() for p in learner.params]
    learner.insert(header, arrays)
    assert learner.step()
    assert math.isfinite(learner.last_loss) and learner.updates == 1
    changed = [not torch.equal(a, b) for a, b in zip(before, learner.params, strict=True)]
    assert all(changed)  # every conv and linear layer of both networks trained
    policy = NumpyConvNet(learner.get_weights())
    with torch.no_grad():
        want = learner.actor(torch.from_numpy(arrays["obs"])).numpy()
    np.testing.assert_allclose(policy(arrays["obs"]), want, rtol=1e-4, atol=1e-6)
