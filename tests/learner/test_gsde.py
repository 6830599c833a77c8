"""gSDE (generalized state-dependent exploration) for SAC: the actor on both sides of the
weight-name contract, how a chunk's envs draw their noise, and the learner's settings around it
(a fixed entropy coefficient, RL-Zoo's MountainCarContinuous-v0 preset). Pure logic, no server."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterenv.learner.core.networks import SDEActor
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.sac.config import SACConfig
from clusterenv.learner.sac.learning import SACLearner
from clusterenv.learner.tools.presets import defaults_for
from clusterenv.pipeline.behaviour import Behaviour, SquashedGaussian, StateDependentNoise
from clusterenv.pipeline.policy import SDE_MEAN_CLIP, SDE_VAR_EPS, NumpyMLP, numpy_policy
from clusterenv.pipeline.task_args import TaskArgsError
from tests.learner.test_sac_unit import ACTIONS, filled_replay


def actor(seed: int = 0, log_std_init: float = -1.0) -> SDEActor:
    torch.manual_seed(seed)
    return SDEActor(3, 2, [16, 8], log_std_init)


def states(rows: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, 3)).astype(np.float32)


def test_numpy_and_torch_forwards_agree_and_the_std_is_the_features_norm_under_sigma():
    """Outputs are 2 clipped means, then log sqrt(Σ_j z_j² σ_jk² + eps), z the last layer's
    inputs: checked against a hand computation from the published arrays."""
    net = actor()
    with torch.no_grad():
        net.sde["log_std"].copy_(torch.randn(8, 2) * 0.5 - 1.0)  # a σ of its own per weight
        net.layers[-1].bias.copy_(torch.tensor([3.0, -0.1]))  # a first mean beyond the clip
    weights = net.get_weights()
    assert set(weights) == {f"layers.{i}.{p}" for i in range(3) for p in ("weight", "bias")} | {
        "sde.log_std"
    }
    policy = numpy_policy(weights)
    obs = states(32)
    out = policy(obs)
    assert isinstance(policy, NumpyMLP) and out.shape == (32, 4) and policy.num_outputs == 4
    np.testing.assert_allclose(out, net(torch.from_numpy(obs)).detach().numpy(), atol=1e-5)
    z = obs
    for i in range(2):
        z = np.maximum(z @ weights[f"layers.{i}.weight"].T + weights[f"layers.{i}.bias"], 0)
    means = z @ weights["layers.2.weight"].T + weights["layers.2.bias"]
    sigma = np.exp(weights["sde.log_std"].astype(np.float64))
    std = np.sqrt((z.astype(np.float64) ** 2) @ sigma**2 + SDE_VAR_EPS)
    np.testing.assert_allclose(out[:, :2], np.clip(means, -SDE_MEAN_CLIP, SDE_MEAN_CLIP), atol=1e-5)
    assert out[:, 0].max() == pytest.approx(SDE_MEAN_CLIP)  # the clip took
    np.testing.assert_allclose(out[:, 2:], np.log(std), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(policy.forward(obs)[1], z, atol=1e-5)


# A dueling head that fits the last layer's 2 outputs.
DUELING_HEAD = {"value.weight": np.ones((1, 2), np.float32), "value.bias": np.zeros(1, np.float32),
                "advantage.weight": np.ones((2, 2), np.float32),
                "advantage.bias": np.zeros(2, np.float32)}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda w: w.update({"sde.log_std": w["sde.log_std"][:, :1]}), "does not fit"),
        (lambda w: w.update({"sde.log_std": w["sde.log_std"] * np.nan}), "non-finite"),
        (lambda w: w.update(DUELING_HEAD), "dueling"),
    ],
)
def test_a_gsde_actor_that_does_not_fit_is_refused_by_name(change, message):
    weights = actor().get_weights()
    change(weights)
    with pytest.raises(ValueError, match=message):
        numpy_policy(weights)


def test_a_chunk_holds_each_envs_noise_and_the_next_chunk_draws_it_anew():
    """Within a chunk an env's action is a function of its state (the same state, the same
    action); envs of one chunk and the next chunk's draws differ."""
    policy = numpy_policy(actor().get_weights())
    obs = np.repeat(states(1), 4, axis=0)  # four envs in the same state
    act = StateDependentNoise().acting(policy, 4, np.random.default_rng(0))
    outputs, first, extra = act(obs)
    _, again, _ = act(obs)
    assert extra == {} and first.shape == (4, 2) and np.abs(first).max() <= 1.0
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(outputs, policy(obs))
    assert len({tuple(row) for row in first}) == 4  # each env its own θ
    _, other, _ = StateDependentNoise().acting(policy, 4, np.random.default_rng(1))(obs)
    assert not np.allclose(first, other)


def test_over_chunks_the_noise_is_the_gaussian_the_outputs_describe():
    """Drawn anew 4,000 times, the pre-squash actions at a state have the outputs' mean and std
    (so APS's Gaussian KL and evaluation's tanh(mean) read the same policy the envs see)."""
    policy = numpy_policy(actor(log_std_init=-0.5).get_weights())
    obs = states(3)
    u = np.stack([
        np.arctanh(StateDependentNoise().acting(policy, 3, np.random.default_rng(s))(obs)[1])
        for s in range(4_000)
    ])  # fmt: skip
    out = policy(obs)
    np.testing.assert_allclose(u.mean(axis=0), out[:, :2], atol=0.05)
    np.testing.assert_allclose(u.std(axis=0), np.exp(out[:, 2:]), rtol=0.05)


def test_gsde_acts_only_through_a_chunk_with_a_gsde_actor_and_records_nothing():
    with pytest.raises(TypeError, match="acting"):
        StateDependentNoise().act(np.zeros((1, 4)), np.random.default_rng(0))
    plain = NumpyMLP({"layers.0.weight": np.ones((4, 3), np.float32),
                      "layers.0.bias": np.zeros(4, np.float32)})  # fmt: skip
    with pytest.raises(ValueError, match="gSDE actor"):
        StateDependentNoise().acting(plain, 1, np.random.default_rng(0))
    assert Behaviour.from_json({"kind": "gsde"}) == StateDependentNoise()
    with pytest.raises(TaskArgsError, match="record"):
        Behaviour.from_json({"kind": "gsde", "record": True})
    # Its divergences are the squashed Gaussian's: the same outputs.
    assert StateDependentNoise.DIVERGENCES == SquashedGaussian.DIVERGENCES


def gsde_learner(seed: int = 0, **settings) -> SACLearner:
    cfg = SACConfig(hidden="16,8", batch_size=64, learning_starts=64, samples_per_insert=1e6,
                    gsde=True, log_std_init=-2.0, **settings)  # fmt: skip
    limiter = RateLimiter(cfg.samples_per_insert, cfg.learning_starts, 1e9)
    limiter.on_insert(512)
    return SACLearner(3, ACTIONS, cfg, filled_replay(), limiter, seed, save_replay=True)


def test_sac_with_gsde_learns_sigma_publishes_what_workers_compute_and_resumes():
    sac = gsde_learner()
    assert isinstance(sac.actor, SDEActor)
    start = sac.actor.sde["log_std"].detach().clone()
    for _ in range(3):
        assert sac.step()
    assert not torch.equal(sac.actor.sde["log_std"], start)  # σ is learned
    obs = states(16)
    np.testing.assert_allclose(numpy_policy(sac.get_weights())(obs),
                               sac.actor(torch.from_numpy(obs)).detach().numpy(), atol=1e-5)  # fmt: skip
    arrays, values = sac.save()
    assert "actor.sde.log_std" in arrays
    sac.step()
    other = gsde_learner(seed=3)
    other.restore(arrays, values)
    other.step()
    for (name, x), (_, y) in zip(sac.actor.state_dict().items(),
                                 other.actor.state_dict().items(), strict=True):  # fmt: skip
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_a_fixed_entropy_coefficient_stays_where_it_started():
    sac = gsde_learner(init_alpha=0.1, learn_alpha=False)
    for _ in range(3):
        assert sac.step()
    assert float(sac.log_alpha.detach().exp()) == pytest.approx(0.1)
    assert sac.last["learner/alpha"] == pytest.approx(0.1)


def test_mountain_car_continuous_takes_rl_zoos_gsde_settings_on_both_sides():
    """The preset is RL-Zoo's, and SB3's arguments built from it (bench/sb3_dqn.py) draw gSDE's
    noise once a rollout of --chunk-steps and train as often, as a chunk here does."""
    from bench.sb3_dqn import sb3_sac_params_from_preset

    cfg = defaults_for("MountainCarContinuous-v0", "sac", use_preset=True)
    s = cfg.agent
    assert (s.gsde, s.log_std_init, s.learn_alpha, s.init_alpha) == (True, -3.67, False, 0.1)
    assert (s.hidden, s.batch_size, s.gamma, s.tau, cfg.total_steps) == (
        "64,64", 512, 0.9999, 0.01, 50_000)  # fmt: skip
    sb3 = sb3_sac_params_from_preset("MountainCarContinuous-v0")
    assert sb3["use_sde"] and sb3["ent_coef"] == 0.1
    assert sb3["train_freq"] == sb3["gradient_steps"] == cfg.collection.chunk_steps == 32
    assert sb3["policy_kwargs"] == {"net_arch": [64, 64], "log_std_init": -3.67}
    assert not sb3_sac_params_from_preset("Pendulum-v1")["use_sde"]
