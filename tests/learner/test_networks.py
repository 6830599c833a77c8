"""The learner's networks against the workers' numpy forward (the weight-name contract), and the
torso chosen from the observation's shape or by --torso."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterenv.learner.core.networks import MLP, ConvNet, build_network, pick_torso
from clusterenv.learner.core.policies import CategoricalPolicy
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.persistence.checkpoint import save_checkpoint
from clusterenv.learner.persistence.components import gather
from clusterenv.learner.ppo.config import PPOConfig
from clusterenv.learner.ppo.learning import PPOLearner
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.tools.eval_checkpoint import load_policy as load_checkpoint_policy
from clusterenv.pipeline.codec import encode_weights
from clusterenv.pipeline.policy import NumpyConvNet, NumpyMLP, load_policy


def observations(shape: tuple[int, ...], kind: str, n: int = 8, seed: int = 1) -> np.ndarray:
    """Real-looking rows: uint8 frames, 0/1 planes, or CartPole-like floats."""
    rng = np.random.default_rng(seed)
    if kind == "frames":
        return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    if kind == "planes":
        return (rng.random((n, *shape)) < 0.2).astype(np.uint8)
    return rng.normal(size=(n, *shape)).astype(np.float32)


def randomize(net: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights and biases (no zero biases), at each layer's own scale."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            fan_in = p[0].numel() if p.ndim > 1 else 10
            p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)
    return net


CASES = {  # name: (observation shape, what the rows look like, the torso auto picks)
    "nature": ((4, 84, 84), "frames", ConvNet),
    "minatar": ((6, 10, 10), "planes", ConvNet),
    "mlp": ((4,), "floats", MLP),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dueling", [False, True], ids=["plain", "dueling"])
def test_numpy_and_torch_forwards_agree(name: str, seed: int, dueling: bool):
    shape, kind, cls = CASES[name]
    net = randomize(build_network(shape, 5, "auto", [32, 16], dueling), seed)
    assert isinstance(net, cls)
    obs = observations(shape, kind, seed=seed)
    with torch.no_grad():
        want = net(torch.from_numpy(obs)).numpy()
    # As a worker gets it: through a safetensors blob.
    policy = load_policy(encode_weights(net.get_weights()))
    assert isinstance(policy, NumpyConvNet if cls is ConvNet else NumpyMLP)
    assert policy.takes(shape) and policy.num_outputs == 5
    got = policy(obs)
    assert np.abs(want).max() > 0.1  # not a comparison of zeros
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_conv_net_publishes_the_contracts_names_and_nothing_else():
    w = build_network((4, 84, 84), 6, "auto", [64]).get_weights()
    convs = {f"conv.{i}.{p}" for i in range(3) for p in ("weight", "bias", "stride")}
    dense = {f"layers.{i}.{p}" for i in range(2) for p in ("weight", "bias")}
    assert set(w) == {"input.shape", "input.scale"} | convs | dense
    assert w["input.shape"].tolist() == [4, 84, 84] and w["input.shape"].dtype == np.int64
    assert w["input.scale"] == np.float32(1 / 255)
    assert [int(w[f"conv.{i}.stride"][0]) for i in range(3)] == [4, 2, 1]
    assert [w[f"conv.{i}.weight"].shape for i in range(3)] == [
        (32, 4, 8, 8), (64, 32, 4, 4), (64, 64, 3, 3)
    ]  # fmt: skip
    assert w["layers.0.weight"].shape == (512, 64 * 7 * 7) and w["layers.1.weight"].shape == (
        6,
        512,
    )
    m = build_network((6, 10, 10), 1, "auto", [64]).get_weights()  # a value: one output
    assert m["input.scale"] == 1.0 and m["layers.0.weight"].shape == (128, 16 * 8 * 8)
    assert m["layers.1.weight"].shape == (1, 128)


@pytest.mark.parametrize(
    ("shape", "flag", "torso"),
    [
        ((4, 84, 84), "auto", "nature"),
        ((1, 84, 84), "auto", "nature"),
        ((6, 10, 10), "auto", "minatar"),
        ((4,), "auto", "mlp"),
        ((84, 84, 4), "auto", "mlp"),  # channel-last: not a frame the conv torsos take
        ((2, 3), "auto", "mlp"),
        ((4, 84, 84), "mlp", "mlp"),
        ((6, 10, 10), "mlp", "mlp"),
        ((4, 84, 84), "minatar", "minatar"),
        ((3, 64, 64), "nature", "nature"),
    ],
)
def test_the_torso_follows_the_shape_unless_the_flag_names_one(shape, flag, torso):
    assert pick_torso(shape, flag) == torso
    net = build_network(shape, 2, flag, [8])
    assert isinstance(net, MLP if torso == "mlp" else ConvNet)


@pytest.mark.parametrize(
    ("shape", "flag", "message"),
    [
        ((4,), "nature", r"--torso nature takes channel-first \(C, H, W\) observations, not shape \(4,\)"),
        ((84, 84), "minatar", "--torso minatar takes channel-first"),
        ((6, 10, 10), "nature", r"--torso nature: its convolutions do not fit .* \(6, 10, 10\)"),
        ((6, 2, 2), "minatar", "--torso minatar: its convolutions do not fit"),
    ],
)  # fmt: skip
def test_a_conv_torso_that_cannot_take_the_shape_is_refused_by_the_flags_name(shape, flag, message):
    with pytest.raises(ValueError, match=message):
        build_network(shape, 2, flag, [8])


def test_the_flag_reaches_both_agents_networks():
    replay = ReplayBuffer(4, (4, 84, 84), np.uint8)
    dqn = DQNLearner((4, 84, 84), 3, DQNConfig(torso="mlp", hidden="8"), replay,
                     RateLimiter(1.0, 1, 0.0), seed=0)  # fmt: skip
    assert isinstance(dqn.q, MLP) and isinstance(dqn.target, MLP)
    ppo = PPOLearner(
        (6, 10, 10),
        CategoricalPolicy(3),
        PPOConfig(),
        RateLimiter(1.0, 0, 1.0),
        lambda v: 0,
        seed=0,
    )
    assert isinstance(ppo.actor, ConvNet) and isinstance(ppo.critic, ConvNet)  # the same kind
    assert ppo.critic.layers[-1].out_features == 1


def test_a_conv_learner_checkpoint_restores_and_clusterenv_eval_acts_with_it(tmp_path):
    def fresh(seed: int) -> DQNLearner:
        replay = ReplayBuffer(4, (6, 10, 10), np.uint8)
        return DQNLearner((6, 10, 10), 3, DQNConfig(), replay, RateLimiter(1.0, 1, 0.0), seed)

    saved, other = fresh(0), fresh(1)
    arrays, values = saved.save()
    assert arrays["q.conv.0.stride"].dtype == np.int64  # the buffers travel with the weights
    other.restore(arrays, values)
    for name, value in other.save()[0].items():
        np.testing.assert_array_equal(arrays[name], value, err_msg=name)
    # The file a run writes, read as `clusterenv eval` reads it.
    path = save_checkpoint(tmp_path, "final", gather({"learner": saved})[0], {})
    policy = load_checkpoint_policy(path)
    assert isinstance(policy, NumpyConvNet) and policy.takes((6, 10, 10))
    obs = observations((6, 10, 10), "planes")
    with torch.no_grad():
        want = other.q(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy(obs), want, rtol=1e-5, atol=1e-6)


def test_a_dueling_head_is_the_contracts_four_names_and_a_half_head_is_refused():
    w = build_network((4,), 3, "mlp", [8], dueling=True).get_weights()
    assert set(w) == {"layers.0.weight", "layers.0.bias", "value.weight", "value.bias",
                      "advantage.weight", "advantage.bias"}  # fmt: skip
    q = NumpyMLP(w)(observations((4,), "floats"))
    # Q = V + A - mean(A): the outputs' mean over actions is the state value.
    h = np.maximum(observations((4,), "floats") @ w["layers.0.weight"].T + w["layers.0.bias"], 0)
    np.testing.assert_allclose(q.mean(axis=1), (h @ w["value.weight"].T + w["value.bias"])[:, 0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    half = {k: v for k, v in w.items() if not k.startswith("value.")}
    with pytest.raises(ValueError, match="advantage.weight without value.weight"):
        NumpyMLP(half)
    wrong = {**w, "value.weight": np.zeros((2, 8), np.float32)}
    with pytest.raises(ValueError, match="value"):
        NumpyMLP(wrong)
    plain = build_network((4,), 3, "mlp", [8]).get_weights()
    with pytest.raises(ValueError, match="no part of a network"):
        NumpyMLP({**plain, "value.bias": np.zeros(1, np.float32)})  # no value.weight: stray


def test_a_dueling_learners_checkpoint_plays_back_in_clusterenv_eval(tmp_path):
    replay = ReplayBuffer(4, (4,), np.float32)
    cfg = DQNConfig(hidden="16", dueling=True)
    learner = DQNLearner((4,), 2, cfg, replay, RateLimiter(1.0, 1, 0.0), seed=0)
    path = save_checkpoint(tmp_path, "final", gather({"learner": learner})[0], {})
    policy = load_checkpoint_policy(path)
    assert isinstance(policy, NumpyMLP) and policy.head is not None
    obs = observations((4,), "floats")
    with torch.no_grad():
        want = learner.q(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy(obs), want, rtol=1e-5, atol=1e-6)
