"""Double DQN on fixed batches, and its rate-limited step (pure logic, no server)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.run.wiring import configure_torch

OBS_DIM, ACTIONS = 3, 2


def make(
    target_update_every: int = 10_000,
    limiter: RateLimiter | None = None,
    replay: ReplayBuffer | None = None,
    **cfg,
) -> DQNLearner:
    config = DQNConfig(
        lr=1e-2, batch_size=16, gamma=0.9, hidden="32", target_update_every=target_update_every
    )
    for k, v in cfg.items():
        setattr(config, k, v)
    return DQNLearner(
        (OBS_DIM,),
        ACTIONS,
        config,
        replay or ReplayBuffer(256, (OBS_DIM,), np.float32),
        limiter or RateLimiter(samples_per_insert=1.0, min_size=16, error_buffer=16.0),
        seed=0,
    )


def batch(n: int = 32, terminated: float = 0.0, next_scale: float = 1.0, seed: int = 0,
          n_steps: int = 1):  # fmt: skip
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
        "action": rng.integers(ACTIONS, size=n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": (next_scale * rng.normal(size=(n, OBS_DIM))).astype(np.float32),
        "terminated": np.full(n, terminated, np.float32),
        "n_steps": np.full(n, n_steps, np.uint8),
    }


def td_target(learner: DQNLearner, b: dict[str, np.ndarray]) -> torch.Tensor:
    """The TD target, computed independently from the two networks."""
    with torch.no_grad():
        next_obs = torch.from_numpy(b["next_obs"])
        if learner.cfg.double:  # the online net picks, the target evaluates
            pick = learner.q(next_obs).argmax(dim=1, keepdim=True)
            next_q = learner.target(next_obs).gather(1, pick).squeeze(1)
        else:
            next_q = learner.target(next_obs).max(dim=1).values
        not_done = 1.0 - torch.from_numpy(b["terminated"])
        discount = learner.cfg.gamma ** torch.from_numpy(b["n_steps"]).double()
        return torch.from_numpy(b["reward"]) + discount.float() * not_done * next_q


def q_taken(learner: DQNLearner, b: dict[str, np.ndarray]) -> torch.Tensor:
    action = torch.from_numpy(b["action"]).unsqueeze(1)
    return learner.q(torch.from_numpy(b["obs"])).gather(1, action).squeeze(1)


def expected_loss(learner: DQNLearner, b: dict[str, np.ndarray]) -> float:
    """The Huber TD loss, computed independently from the two networks."""
    with torch.no_grad():
        return float(nn.functional.smooth_l1_loss(q_taken(learner, b), td_target(learner, b)))


def params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_repeated_updates_on_one_batch_lower_the_td_loss():
    learner, b = make(), batch()
    losses = [learner.update(b) for _ in range(200)]
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.1 * losses[0]
    assert learner.updates == 200


def test_update_returns_the_double_dqn_loss_before_its_step():
    learner = make()
    for seed in range(5):  # the online net drifts from the target: Double DQN differs from max
        learner.update(batch(seed=seed))
    b = batch(seed=99, next_scale=5.0)
    want = expected_loss(learner, b)
    assert learner.update(b) == pytest.approx(want, rel=1e-5)


def test_terminated_transitions_do_not_bootstrap():
    # Next states far out, so the (untrained) target net gives them large values.
    done, going = batch(terminated=1.0, next_scale=100.0), batch(terminated=0.0, next_scale=100.0)
    a, b = make(), make()  # the same seed: identical networks
    rewards_only = float(
        nn.functional.smooth_l1_loss(
            a.q(torch.from_numpy(done["obs"])).detach()[
                torch.arange(32), torch.from_numpy(done["action"])
            ],
            torch.from_numpy(done["reward"]),
        )
    )
    loss_done, loss_going = a.update(done), b.update(going)
    assert loss_done == pytest.approx(rewards_only, rel=1e-5)  # td target = reward alone
    assert loss_going > 2 * loss_done  # bootstrapped from the large next-state values


def test_non_terminal_transitions_bootstrap_from_the_target_net():
    # Replay keeps only `terminated`: a time-limit truncation (terminated = 0) bootstraps too.
    learner, b = make(), batch(terminated=0.0, next_scale=100.0)
    with_bootstrap = expected_loss(learner, b)
    assert learner.update(b) == pytest.approx(with_bootstrap, rel=1e-5)


@pytest.mark.parametrize("k", [1, 3])
def test_an_n_step_row_bootstraps_gamma_to_the_k_later(k):
    learner, b = make(), batch(terminated=0.0, next_scale=100.0, n_steps=k)
    one_step = expected_loss(learner, {**b, "n_steps": np.ones(32, np.uint8)})
    expected = expected_loss(learner, b)
    assert learner.update(b) == pytest.approx(expected, rel=1e-5)
    assert (expected == pytest.approx(one_step)) == (k == 1)


def test_target_network_copies_every_target_update_every_updates():
    learner = make(target_update_every=3)
    last_copy = params(learner.target)
    assert same(last_copy, params(learner.q))
    for i in range(1, 8):
        learner.update(batch(seed=i))
        if i % 3:  # between copies the target stays at the last copy while q trains on
            assert same(params(learner.target), last_copy), i
            assert not same(params(learner.target), params(learner.q)), i
        else:
            assert same(params(learner.target), params(learner.q)), i
            assert not same(params(learner.target), last_copy), i
            last_copy = params(learner.target)


def test_step_waits_for_the_rate_limiter():
    replay = ReplayBuffer(256, (OBS_DIM,), np.float32)
    limiter = RateLimiter(samples_per_insert=1.0, min_size=16, error_buffer=16.0)
    learner = make(limiter=limiter, replay=replay)
    before = params(learner.q)
    assert learner.step() is False  # replay below min_size: no sampling
    assert learner.updates == 0 and limiter.samples == 0 and np.isnan(learner.last_loss)
    assert same(before, params(learner.q))

    b = batch(n=32)
    replay.add(b["obs"], b["action"], b["reward"], b["next_obs"], b["terminated"])
    limiter.on_insert(32)
    ran = 0
    while learner.step():
        ran += 1
        assert limiter.samples == 16 * ran and learner.updates == ran
        assert np.isfinite(learner.last_loss)
    # 32 inserts x 1 sample each, with sampling allowed down to target - error = 0:
    # diff - batch >= 0 holds at 0 and 16 samples taken, not at 32.
    assert ran == 2 and limiter.samples == 32
    assert not same(before, params(learner.q))
    limiter.on_insert(16)
    assert learner.step() is True and limiter.samples == 48


def test_get_weights_are_numpy_copies_named_for_numpy_mlp():
    learner = make()
    w = learner.get_weights()
    assert set(w) == {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"}
    assert w["layers.0.weight"].shape == (32, OBS_DIM) and w["layers.1.bias"].shape == (ACTIONS,)
    learner.update(batch())
    assert not np.array_equal(w["layers.0.weight"], learner.get_weights()["layers.0.weight"])


def test_plain_dqn_bootstraps_on_the_target_nets_max():
    """--no-double: the TD target uses max_a Q_target(s', a), not Q_target(s', argmax_a Q(s', a))."""
    import torch

    from clusterenv.learner.dqn.config import DQNConfig
    from clusterenv.learner.dqn.learning import DQNLearner
    from clusterenv.learner.replay.rate_limiter import RateLimiter
    from clusterenv.learner.replay.uniform import ReplayBuffer

    replay = ReplayBuffer(10, (4,), np.float32)
    limiter = RateLimiter(1.0, 1, 0.0)
    targets = {}
    for double in (True, False):
        learner = DQNLearner((4,), 2, DQNConfig(double=double, lr=1e-9), replay, limiter, seed=3)
        with torch.no_grad():  # online net prefers action 0, target net values action 1 higher
            for net, (a0, a1) in ((learner.q, (5.0, 0.0)), (learner.target, (1.0, 9.0))):
                last = net.layers[-1]
                last.weight.zero_()
                last.bias.copy_(torch.tensor([a0, a1]))
        batch = {
            "obs": np.zeros((1, 4), np.float32), "next_obs": np.zeros((1, 4), np.float32),
            "action": np.zeros(1, np.int64), "reward": np.zeros(1, np.float32),
            "terminated": np.zeros(1, np.float32), "n_steps": np.ones(1, np.uint8),
        }  # fmt: skip
        # Huber loss at q_taken = 5: |target - 5| - 0.5 for a large error.
        targets[double] = learner.update(batch)
    assert targets[True] == pytest.approx(abs(0.99 * 1.0 - 5.0) - 0.5, rel=1e-4)
    assert targets[False] == pytest.approx(abs(0.99 * 9.0 - 5.0) - 0.5, rel=1e-4)


def autograd_update(learner: DQNLearner, b: dict[str, np.ndarray]) -> None:
    """The textbook step with autograd: the Huber TD loss, backward, clip_grad_norm_, Adam."""
    loss = nn.functional.smooth_l1_loss(q_taken(learner, b), td_target(learner, b))
    learner.optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(learner.q.parameters(), learner.cfg.max_grad_norm)
    learner.optimizer.step()


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("max_grad_norm", [10.0, 0.05])  # 0.05: every step is clipped
@pytest.mark.parametrize("dueling", [False, True])
def test_the_hand_written_step_matches_autograds(double: bool, max_grad_norm: float, dueling: bool):
    settings = dict(double=double, max_grad_norm=max_grad_norm, hidden="32,16",
                    target_update_every=3, dueling=dueling)  # fmt: skip
    hand, ref = make(**settings), make(**settings)
    for step in range(12):
        b = batch(seed=step, next_scale=3.0, terminated=float(step % 4 == 0))
        hand.update(b)
        autograd_update(ref, b)
        if step % 3 == 2:  # both copy their target nets every 3 updates
            ref.target.load_state_dict(ref.q.state_dict())
    for a, r in zip(hand.q.parameters(), ref.q.parameters(), strict=True):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hand.q.layers[0].weight.grad, ref.q.layers[0].weight.grad)
    assert not torch.equal(hand.q.layers[0].weight, make(hidden="32,16").q.layers[0].weight)
    if dueling:  # the head's own gradients, written by hand, too
        torch.testing.assert_close(hand.q.advantage.weight.grad, ref.q.advantage.weight.grad)
        torch.testing.assert_close(hand.q.value.bias.grad, ref.q.value.bias.grad)


def test_lr_falls_linearly_to_lr_end_over_the_budget_and_stays_there():
    cfg = DQNConfig(lr=1e-3, lr_end=1e-4)
    assert [cfg.lr_at(s, 1000) for s in (0, 500, 1000, 5000)] == pytest.approx(
        [1e-3, 5.5e-4, 1e-4, 1e-4]
    )
    assert DQNConfig(lr=1e-3).lr_at(999, 1000) == 1e-3  # no --lr-end: constant


def test_the_learner_thread_flushes_subnormal_floats_to_zero():
    """What the Run sets up: Adam's moments of silent units decay into subnormals, which are slow."""
    tiny = torch.finfo(torch.float32).tiny
    threads = torch.get_num_threads()
    torch.set_flush_denormal(False)
    try:
        assert (torch.tensor([tiny]) / 4).item() > 0.0  # a subnormal, kept
        configure_torch(threads)
        assert (torch.tensor([tiny]) / 4).item() == 0.0
        assert torch.get_num_threads() == threads
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("package", ["clusterenv.learner", "clusterenv.tasks"])
def test_learner_and_workers_give_openblas_one_thread_unless_the_user_set_it(package: str):
    """Set before numpy loads: an idle OpenBLAS thread spins after each small matmul."""
    code = f"import {package}, numpy, os; print(os.environ['OPENBLAS_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "1", run.stderr
    env["OPENBLAS_NUM_THREADS"] = "3"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "3", run.stderr


def frames_batch(shape: tuple[int, ...], n: int, seed: int, terminated: float) -> dict:
    """A minibatch of uint8 observations as replay gives them: frames (84x84) or 0/1 planes."""
    rng = np.random.default_rng(seed)
    high = 256 if shape[1] == 84 else 2
    return {
        "obs": rng.integers(0, high, size=(n, *shape), dtype=np.uint8),
        "action": rng.integers(ACTIONS, size=n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.integers(0, high, size=(n, *shape), dtype=np.uint8),
        "terminated": np.full(n, terminated, np.float32),
        "n_steps": np.ones(n, np.uint8),
    }


@pytest.mark.parametrize("shape", [(6, 10, 10), (4, 84, 84)], ids=["minatar", "nature"])
@pytest.mark.parametrize(("double", "max_grad_norm"), [(True, 10.0), (False, 0.05)])
def test_a_conv_nets_autograd_step_matches_the_textbook_one(shape, double, max_grad_norm):
    """A conv torso falls back to autograd inside `update`: the same Huber gradient, clipping
    and fused Adam as the textbook loss.backward() + clip_grad_norm_ + optimizer.step(), step by
    step from the same state. (Not over many steps apart: clipping sums the norm in another
    order, and over a few steps a ReLU of the 84x84 net flips one way in one and not the other.)"""

    def conv_learner() -> DQNLearner:
        config = DQNConfig(lr=1e-3, batch_size=16, gamma=0.9, double=double,
                           max_grad_norm=max_grad_norm, target_update_every=3)  # fmt: skip
        replay = ReplayBuffer(16, shape, np.uint8)
        return DQNLearner(shape, ACTIONS, config, replay, RateLimiter(1.0, 16, 16.0), seed=0)

    hand, ref = conv_learner(), conv_learner()
    assert not hasattr(hand.q, "backward")  # a ConvNet: no hand-written backward to take
    start = params(hand.q)
    for step in range(4):  # the target copy after the third
        ref.q.load_state_dict(hand.q.state_dict())
        ref.target.load_state_dict(hand.target.state_dict())
        ref.optimizer.load_state_dict(copy.deepcopy(hand.optimizer.state_dict()))  # not shared
        b = frames_batch(shape, 16, seed=step, terminated=float(step % 2 == 0))
        want = expected_loss(ref, b)
        assert hand.update(b) == pytest.approx(want, rel=1e-5)
        autograd_update(ref, b)
        for a, r in zip(hand.q.parameters(), ref.q.parameters(), strict=True):
            scale = float(r.grad.abs().max())
            torch.testing.assert_close(a.grad, r.grad, rtol=1e-4, atol=1e-4 * scale)
            torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-7)
    assert hand.updates == 4 and not same(start, params(hand.q))
    assert not same(params(hand.target), params(hand.q))  # copied after update 3, trained since
