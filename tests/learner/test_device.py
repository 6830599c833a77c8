"""`--device`: the learner's networks and updates on cpu or cuda; everything passes on CPU, and
the CUDA cases run where torch sees a GPU (skipped elsewhere, with the reason)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.policies import CategoricalPolicy
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.ppo.config import PPOConfig
from clusterenv.learner.ppo.learning import PPOLearner
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")


def test_auto_is_cuda_where_torch_sees_one_else_cpu():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert TrainConfig().torch_device().type == want
    assert TrainConfig(device="cpu").torch_device() == torch.device("cpu")


@pytest.mark.parametrize(
    "device, message",
    [("tpu", "not a torch device"), ("meta", "runs on cpu or cuda"), ("cuda:99", "CUDA")],
)
def test_a_device_torch_cannot_use_is_refused_by_name(device, message):
    with pytest.raises(ValueError, match=f"--device {device}.*{message}|--device '{device}'"):
        TrainConfig(device=device).validate()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_on_a_machine_without_one_says_so():
    with pytest.raises(ValueError, match="--device cuda: torch .* sees no CUDA device here"):
        TrainConfig(device="cuda").validate()


def frames(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 2, (rows + 1, 4, 10, 10), dtype=np.uint8)
    return {"obs": obs[:-1], "action": rng.integers(3, size=rows),
            "reward": rng.normal(size=rows).astype(np.float32), "next_obs": obs[1:],
            "terminated": rng.random(rows) < 0.1, "truncated": np.zeros(rows, bool),
            "env_index": np.zeros(rows, np.int32), "logp": np.full(rows, -1.1, np.float32)}  # fmt: skip


def dqn(device: torch.device) -> DQNLearner:
    replay = ReplayBuffer(256, (4, 10, 10), np.dtype(np.uint8))
    learner = DQNLearner((4, 10, 10), 3, DQNConfig(batch_size=32), replay,
                         RateLimiter(4.0, 64, 1e9), seed=0, device=device)  # fmt: skip
    learner.insert({}, frames(128))
    return learner


def ppo(device: torch.device) -> PPOLearner:
    learner = PPOLearner((4, 10, 10), CategoricalPolicy(3), PPOConfig(batch_steps=64, num_minibatches=2),
                         RateLimiter(1.0, 0, 1e9), lambda v: 0, seed=0, device=device)  # fmt: skip
    learner.insert({"policy_version": 0}, frames(64))
    return learner


@pytest.mark.parametrize("make", [dqn, ppo], ids=["dqn", "ppo"])
def test_an_update_on_the_cpu_device_given_explicitly(make):
    learner = make(torch.device("cpu"))
    assert learner.step() and np.isfinite(learner.last_loss)
    assert all(a.dtype == np.float32 or a.dtype.kind == "i" for a in learner.get_weights().values())


@CUDA
@pytest.mark.parametrize("make", [dqn, ppo], ids=["dqn", "ppo"])
def test_a_cuda_update_matches_the_cpu_one(make):
    cpu, gpu = make(torch.device("cpu")), make(torch.device("cuda"))
    assert cpu.step() and gpu.step()
    assert gpu.last_loss == pytest.approx(cpu.last_loss, rel=1e-3, abs=1e-5)
    for name, value in cpu.get_weights().items():
        np.testing.assert_allclose(gpu.get_weights()[name], value, rtol=1e-3, atol=1e-5)
    arrays, values = gpu.save()  # checkpoints hold host arrays whatever the device
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
