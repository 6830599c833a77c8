"""`clusterenv eval` on checkpoints saved through the trainer's own code path (no server needed)."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import torch

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.networks import network_arrays
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.persistence.checkpoint import save_checkpoint
from clusterenv.learner.persistence.components import named_tensors
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.tools.cli import main

RESULT = re.compile(r"greedy return (-?[\d.]+) ± ([\d.]+) over (\d+) episodes")


def saved_run(run_dir, hidden: str = "2", controller: bool = True):
    """A run directory as the trainer leaves it: config.json and final.safetensors written by
    the learner's networks (named as the run's `learner` component) + save_checkpoint. With `controller`, the Q-network is set by hand to
    push the cart toward the side the pole falls to (3·θ + θ' > 0: right), which holds CartPole
    up for the full 500 steps; without it, the untrained network's random weights act."""
    cfg = TrainConfig(agent=DQNConfig(hidden=hidden))
    learner = DQNLearner(
        (4,), 2, cfg.agent, ReplayBuffer(64, (4,), np.float32), RateLimiter(1.0, 64, 0.0), 1
    )
    if controller:
        lean = torch.tensor([0.0, 0.0, 3.0, 1.0])
        with torch.no_grad():
            hidden_layer, out = learner.q.layers
            hidden_layer.weight.copy_(torch.stack([lean, -lean]))  # relu(s), relu(-s)
            hidden_layer.bias.zero_()
            out.weight.copy_(
                torch.tensor([[0.0, 1.0], [1.0, 0.0]])
            )  # Q(left)=relu(-s), Q(right)=relu(s)
            out.bias.zero_()
    run_dir.mkdir()
    (run_dir / "config.json").write_text(cfg.to_json())
    final = named_tensors("learner", network_arrays(learner.networks()))
    save_checkpoint(run_dir, "final", final, {"env": cfg.env})
    return run_dir


def result(out: str) -> tuple[float, float, int]:
    match = RESULT.search(out)
    assert match, out
    return float(match[1]), float(match[2]), int(match[3])


def test_eval_of_a_run_dir_and_of_its_checkpoint_file(tmp_path, capsys):
    run = saved_run(tmp_path / "run")
    assert main(["eval", str(run), "--episodes", "3"]) == 0
    assert result(capsys.readouterr().out) == (500.0, 0.0, 3)
    assert main(["eval", str(run / "final.safetensors"), "--episodes", "5", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert result(out) == (500.0, 0.0, 5) and "seeds 7..11" in out


def test_the_checkpoints_own_weights_act(tmp_path, capsys):
    # The untrained network of the same shape does not balance the pole: eval reads the weights.
    run = saved_run(tmp_path / "run", controller=False)
    assert main(["eval", str(run), "--episodes", "4"]) == 0
    mean, _, episodes = result(capsys.readouterr().out)
    assert episodes == 4 and mean < 200


def test_newest_periodic_checkpoint_when_a_run_has_no_final(tmp_path, capsys):
    run = saved_run(tmp_path / "run")
    (run / "checkpoints").mkdir()
    (run / "final.safetensors").rename(run / "checkpoints" / "step_4000.safetensors")
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "step_4000.safetensors" in out and result(out) == (500.0, 0.0, 2)


def not_safetensors(d):
    (d / "final.safetensors").write_text("{}")
    return d / "final.safetensors"


def without_config(d):
    (saved_run(d / "r") / "config.json").unlink()
    return d / "r"


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: d / "missing", "no such file or directory"),
        (lambda d: d, "holds no final.safetensors"),
        (not_safetensors, "not valid safetensors"),
        (without_config, "no config.json"),
    ],
    ids=["missing", "empty dir", "not safetensors", "no config"],
)
def test_bad_paths_are_one_line_errors(tmp_path, capsys, setup, message):
    assert main(["eval", str(setup(tmp_path)), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_the_parent_of_run_directories_is_refused_naming_them(tmp_path, capsys):
    # `train --run-dir P` puts each run in a folder of its own under P.
    saved_run(tmp_path / "CartPole-v1__s1__a")
    saved_run(tmp_path / "CartPole-v1__s2__b")
    assert main(["eval", str(tmp_path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "run directories (CartPole-v1__s1__a, CartPole-v1__s2__b): pass one" in err, err


def test_a_network_that_does_not_fit_the_env_is_refused(tmp_path, capsys):
    run = saved_run(tmp_path / "run")
    (run / "config.json").write_text('{"env": "Acrobot-v1", "env_kwargs": {}}')
    assert main(["eval", str(run)]) == 2
    assert "does not fit Acrobot-v1" in capsys.readouterr().err


VIDEO_DEPS = all(importlib.util.find_spec(m) for m in ("moviepy", "pygame"))


@pytest.mark.skipif(not VIDEO_DEPS, reason="needs the video extra (moviepy, pygame)")
def test_video_writes_one_mp4_per_episode(tmp_path, capsys):
    run = saved_run(tmp_path / "run")
    video = tmp_path / "video"
    # Short episodes keep the encode quick: a 60-step limit through the run's env kwargs.
    (run / "config.json").write_text(
        '{"env": "CartPole-v1", "env_kwargs": {"max_episode_steps": 60}}'
    )
    assert main(["eval", str(run), "--episodes", "2", "--video", str(video)]) == 0
    out = capsys.readouterr().out
    assert result(out) == (60.0, 0.0, 2) and f"videos in {video}" in out
    mp4s = sorted(video.glob("*.mp4"))
    assert len(mp4s) == 2 and all(p.stat().st_size > 1000 for p in mp4s), mp4s
