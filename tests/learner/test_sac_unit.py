"""SAC's learner (learner/sac/): its update, the actor the workers run, its checkpoint. Pure
logic, no server."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.sac.config import SACConfig
from clusterenv.learner.sac.learning import SACLearner
from clusterenv.learner.tools.cli import parse_train
from clusterenv.pipeline.behaviour import SquashedGaussian
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.spaces import BoxActions

ACTIONS = BoxActions.of(
    gym.spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, 1.0]), dtype=np.float32)
)


def filled_replay(rows: int = 512, seed: int = 0) -> ReplayBuffer:
    rng = np.random.default_rng(seed)
    replay = ReplayBuffer(1_000, (3,), np.dtype(np.float32), ACTIONS.array)
    obs = rng.normal(size=(rows, 3)).astype(np.float32)
    action = ACTIONS.from_index(rng.uniform(-1, 1, (rows, 2)))
    replay.add(obs, action, rng.normal(size=rows).astype(np.float32), obs + 0.1,
               rng.random(rows) < 0.05)  # fmt: skip
    return replay


def learner(seed: int = 0, save_replay: bool = False, rows: int = 512) -> SACLearner:
    cfg = SACConfig(hidden="32,32", batch_size=64, learning_starts=64, samples_per_insert=1e6)
    replay = filled_replay(rows)
    limiter = RateLimiter(cfg.samples_per_insert, cfg.learning_starts, 1e9)
    limiter.on_insert(rows)
    return SACLearner(3, ACTIONS, cfg, replay, limiter, seed, save_replay=save_replay)


def test_an_update_trains_critics_actor_and_alpha_and_moves_the_targets_by_tau():
    sac = learner()
    before = {k: v.clone() for k, v in sac.targets.state_dict().items()}
    critics = {k: v.clone() for k, v in sac.critics.state_dict().items()}
    actor = {k: v.clone() for k, v in sac.actor.state_dict().items()}
    assert sac.step()
    out = sac.last
    assert all(np.isfinite(v) for v in out.values()) and sac.updates == 1
    assert out["learner/alpha"] == pytest.approx(1.0)  # α used in this update: the initial one
    assert float(sac.log_alpha.exp()) != 1.0  # ... and moved by it
    for name, value in sac.targets.state_dict().items():
        # Polyak: the target moved `tau` of the way to the critic as the update left it.
        expected = before[name] + sac.cfg.tau * (sac.critics.state_dict()[name] - before[name])
        torch.testing.assert_close(value, expected)
        assert not torch.equal(sac.critics.state_dict()[name], critics[name])
    assert any(not torch.equal(v, actor[k]) for k, v in sac.actor.state_dict().items())


def test_the_critics_take_no_gradient_from_the_actors_loss_and_keep_learning():
    """The actor's loss runs through the critics with their weights frozen: each critic weight
    gets one gradient an update (the critics' loss), not a second from the actor's to be thrown
    away, and is trainable again for the next update."""
    sac = learner()
    grads = []
    for p in sac.critics.parameters():
        p.register_hook(lambda g: grads.append(g))
    assert sac.step()
    assert len(grads) == len(list(sac.critics.parameters()))
    critics = {k: v.clone() for k, v in sac.critics.state_dict().items()}
    assert sac.step()
    assert all(p.requires_grad for p in sac.critics.parameters())
    assert all(not torch.equal(v, critics[k]) for k, v in sac.critics.state_dict().items())


def test_the_published_actor_is_what_the_workers_numpy_forward_computes():
    sac = learner()
    for _ in range(3):
        sac.step()
    obs = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    numpy_out = NumpyMLP(sac.get_weights())(obs)
    torch_out = sac.actor(torch.from_numpy(obs)).detach().numpy()
    assert numpy_out.shape == (16, 4)  # 2 means, 2 log-stds
    np.testing.assert_allclose(numpy_out, torch_out, rtol=1e-5, atol=1e-6)


def test_the_value_probe_models_the_critics_around_the_greedy_action():
    """APS's `value` for SAC: the probe's Q, gradient and curvature columns give the critics'
    change between the learner's and a worker's greedy actions, against evaluating the critics
    at both (relative to |Q|, over 256 states, the worker's means moved by ~0.05)."""
    sac = learner()
    for _ in range(20):
        sac.step()
    rng = np.random.default_rng(2)
    states = rng.normal(size=(256, 3)).astype(np.float32)
    outputs = NumpyMLP(sac.get_weights())(states)
    model = sac.value_model(states, outputs)
    assert model.shape == (256, 1 + 2 + 2)

    def q(means: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            a = torch.tanh(torch.from_numpy(means[:, :2].astype(np.float32)))
            return sac._q(sac.critics, torch.from_numpy(states), a).double().numpy()

    np.testing.assert_allclose(model[:, 0], q(outputs), rtol=1e-5, atol=1e-5)
    worker = outputs.copy()
    worker[:, :2] += rng.normal(scale=0.05, size=(256, 2)).astype(np.float32)
    exact = np.abs(q(worker) - q(outputs)).mean() / np.abs(q(outputs)).mean()
    probe = np.concatenate([outputs, model], axis=1)
    got = SquashedGaussian(record=False).divergence("value", probe, worker)
    assert exact > 0 and got == pytest.approx(exact, rel=0.1)
    assert SquashedGaussian(record=False).divergence("value", probe, outputs) == 0.0


def test_the_critics_see_replays_actions_scaled_back_into_minus_one_one():
    sac = learner()
    raw = ACTIONS.from_index(np.array([[-1.0, -1.0], [0.0, 0.5], [1.0, 1.0]]))
    scaled = (torch.from_numpy(raw) - sac.center) / sac.half
    torch.testing.assert_close(scaled, torch.tensor([[-1.0, -1.0], [0.0, 0.5], [1.0, 1.0]]))


def test_a_checkpoint_resumes_with_its_three_optimizers_the_entropy_coefficient_and_replay():
    """A learner restored from another's checkpoint makes exactly the same next update."""
    a = learner(seed=0, save_replay=True)
    for _ in range(5):
        a.step()
    arrays, values = a.save()
    adams = {k.split(".")[0] for k in arrays if ".optim." in k}
    assert adams == {"adam_actor", "adam_critic", "adam_alpha"}
    a.step()
    # Torch's generator is the process's one (a learner seeds it when made): b is made and
    # restored after a's step, so b draws what a drew.
    b = learner(seed=7, save_replay=True, rows=64)  # other weights, generators and replay
    b.restore(arrays, values)
    assert float(b.log_alpha) != float(a.log_alpha) and b.updates == 5 and a.updates == 6
    assert b.replay.size == a.replay.size
    b.step()
    for net in ("actor", "critics", "targets"):
        for (name, x), (_, y) in zip(getattr(a, net).state_dict().items(),
                                     getattr(b, net).state_dict().items(), strict=True):  # fmt: skip
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=f"{net}.{name}")
    assert float(b.log_alpha) == float(a.log_alpha)


def test_bad_sac_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="--tau"):
        SACConfig(tau=0.0).validate()
    with pytest.raises(ValueError, match="--init-alpha"):
        SACConfig(init_alpha=-1.0).validate()


def test_the_value_measure_is_for_sac_and_refused_for_ppo_by_name():
    cfg = parse_train(["--algo", "sac", "--env", "Pendulum-v1", "--sync", "aps:0.01:value"])
    cfg.validate()
    assert cfg.sync_measure(box_actions=True) == "value"
    ppo = parse_train(["--algo", "ppo", "--env", "Pendulum-v1", "--sync", "aps:0.01:value"])
    with pytest.raises(ValueError, match="the value measure needs Q-values"):
        ppo.validate()


def test_checkpointing_replay_is_refused_for_ppo_which_has_none_and_taken_for_sac():
    parse_train(["--algo", "sac", "--env", "Pendulum-v1", "--checkpoint-replay"]).validate()
    ppo = parse_train(["--algo", "ppo", "--env", "Pendulum-v1", "--checkpoint-replay"])
    with pytest.raises(ValueError, match="--checkpoint-replay: --algo ppo learns from fresh"):
        ppo.validate()
