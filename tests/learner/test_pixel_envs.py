"""The learner's side of the pixel envs: their spaces, and `clusterenv eval` (with --video) on them."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from clusterenv.learner.spaces import env_spaces
from clusterenv.learner.tools.cli import main
from clusterenv.pipeline.codec import ArraySpec, encode_weights
from clusterenv.pipeline.spaces import DiscreteActions

HAS = {m: importlib.util.find_spec(m) is not None for m in ("ale_py", "cv2", "minatar", "moviepy")}
ATARI = pytest.mark.skipif(not (HAS["ale_py"] and HAS["cv2"]), reason="needs the atari extra")
MINATAR = pytest.mark.skipif(not HAS["minatar"], reason="needs the minatar extra")


@ATARI
def test_atari_spaces():
    spaces, _ = env_spaces("ALE/Pong-v5", {})
    # Stacks of 4 frames, which chunks and replay carry once each (pipeline/frames.py).
    assert spaces.obs == ArraySpec("|u1", (4, 84, 84)) and spaces.stack == 4
    assert spaces.frame == ArraySpec("|u1", (84, 84), group="frames")
    assert spaces.action == DiscreteActions(6)


@MINATAR
def test_minatar_spaces():
    spaces, threshold = env_spaces("MinAtar/Breakout-v1", {})
    assert spaces.obs == ArraySpec("|u1", (4, 10, 10)) and spaces.stack == 0  # planes, not stacks
    assert spaces.action == DiscreteActions(3) and threshold is None


def saved_network(folder, env_id, env_kwargs, obs_size, actions):
    """A best.safetensors-style acting network (one linear layer, all zeros: greedy = action 0)
    with the run's config.json beside it."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"env": env_id, "env_kwargs": env_kwargs}))
    weights = {"layers.0.weight": np.zeros((actions, obs_size), np.float32),
               "layers.0.bias": np.zeros(actions, np.float32)}  # fmt: skip
    (folder / "best.safetensors").write_bytes(encode_weights(weights))
    return folder / "best.safetensors"


CASES = [
    # Breakout with the paddle still: the ball is missed within a few dozen steps.
    pytest.param("MinAtar/Breakout-v1", {}, 4 * 10 * 10, 3, marks=MINATAR, id="minatar"),
    # A 400-frame limit (100 steps of 4 frames) keeps the game and the encode short.
    pytest.param(
        "ALE/Pong-v5", {"max_episode_steps": 400}, 4 * 84 * 84, 6, marks=ATARI, id="atari"
    ),
]


@pytest.mark.parametrize(("env_id", "env_kwargs", "obs_size", "actions"), CASES)
def test_eval_plays_the_evaluation_env(tmp_path, capsys, env_id, env_kwargs, obs_size, actions):
    checkpoint = saved_network(tmp_path / "run", env_id, env_kwargs, obs_size, actions)
    assert main(["eval", str(checkpoint), "--episodes", "2"]) == 0
    assert f"{env_id}: greedy return" in capsys.readouterr().out


@pytest.mark.skipif(not HAS["moviepy"], reason="needs the video extra (moviepy)")
@pytest.mark.parametrize(("env_id", "env_kwargs", "obs_size", "actions"), CASES)
def test_eval_video_writes_an_mp4(tmp_path, capsys, env_id, env_kwargs, obs_size, actions):
    checkpoint = saved_network(tmp_path / "run", env_id, env_kwargs, obs_size, actions)
    video = tmp_path / "video"
    assert main(["eval", str(checkpoint), "--episodes", "1", "--video", str(video)]) == 0
    assert f"videos in {video}" in capsys.readouterr().out
    (mp4,) = video.glob("*.mp4")
    assert mp4.name.startswith(env_id.replace("/", "_")) and mp4.stat().st_size > 1000
