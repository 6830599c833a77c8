"""make_env: plain Gymnasium ids as gym.make makes them; a family without its packages is one line
naming the extra."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.pipeline.envs import make_env


@pytest.mark.parametrize("training", [True, False])
def test_a_plain_id_is_gym_make(training):
    env = make_env("CartPole-v1", {"max_episode_steps": 5}, training=training)
    local = gym.make("CartPole-v1", max_episode_steps=5)
    assert env.spec == local.spec and str(env) == str(local)
    np.testing.assert_array_equal(env.reset(seed=3)[0], local.reset(seed=3)[0])
    drawn = make_env("CartPole-v1", {}, training=training, render_mode="rgb_array")
    assert drawn.render_mode == "rgb_array"


def test_unknown_ids_and_kwargs_raise_what_gym_make_raises():
    with pytest.raises(gym.error.Error):
        make_env("NoSuchEnv-v0", {}, training=True)
    with pytest.raises(TypeError):
        make_env("CartPole-v1", {"no_such_kwarg": 1}, training=True)


# Run with the families' packages unimportable, as on a worker of the base install.
WITHOUT_EXTRAS = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"ale_py", "cv2", "minatar"}:
            raise ModuleNotFoundError(name, name=name)

sys.meta_path.insert(0, Missing())
import gymnasium as gym
from clusterenv.learner.spaces import env_spaces
from clusterenv.pipeline.envs import make_env

make_env("CartPole-v1", {}, training=True).reset(seed=0)
for env_id in ("ALE/Pong-v5", "MinAtar/Breakout-v1"):
    try:
        make_env(env_id, {}, training=True)
    except gym.error.DependencyNotInstalled as exc:
        print(exc)
    try:
        env_spaces(env_id, {})
    except ValueError as exc:
        print(exc)
"""


def test_a_family_without_its_packages_names_the_extra():
    out = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "ALE/* envs need ale-py, opencv-python-headless: pip install 'clusterenv[atari]'",
        "--env 'ALE/Pong-v5': ALE/* envs need ale-py, opencv-python-headless: "
        "pip install 'clusterenv[atari]'",
        "MinAtar/* envs need minatar: pip install 'clusterenv[minatar]'",
        "--env 'MinAtar/Breakout-v1': MinAtar/* envs need minatar: "
        "pip install 'clusterenv[minatar]'",
    ]
