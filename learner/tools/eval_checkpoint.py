"""`clusterenv eval`: greedy episodes of a saved network (DQN's Q, PPO's policy) here, optionally as MP4s.

The env (id and keyword arguments) comes from the run's config.json; the forward pass is the
numpy policy the workers act and evaluate with (pipeline/policy.py), and the episodes are
`greedy_returns` of the workers' evaluation, one env, episode i reset with seed S + i.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from clusterenv.learner.persistence.components import LEARNER
from clusterenv.pipeline.codec import decode_weights
from clusterenv.pipeline.envs import make_env
from clusterenv.pipeline.evaluation.runner import greedy_returns
from clusterenv.pipeline.policy import NETWORK_PREFIXES, NumpyPolicy, numpy_policy
from clusterenv.pipeline.spaces import action_spec

# A run's checkpoints hold the network the workers act with under one of these prefixes (DQN: the
# online Q-network, beside `target.`; PPO: the policy, beside `critic.`: the learner component's
# networks); the rest of each name is the weight-name contract (pipeline/policy.py).
# best.safetensors holds that network alone, unprefixed.
ACTING_PREFIXES = (f"{LEARNER}.q.", f"{LEARNER}.actor.")


def find_checkpoint(path: Path) -> Path:
    """A .safetensors file as given; for a run directory its final.safetensors, else the newest
    file in its checkpoints/ folder."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise ValueError(f"{path}: no such file or directory")
    if (path / "final.safetensors").is_file():
        return path / "final.safetensors"
    saved = sorted((path / "checkpoints").glob("*.safetensors"), key=lambda p: p.stat().st_mtime)
    if not saved:
        # `train --run-dir P` makes P the parent of run directories; name them, not a bare miss.
        runs = sorted(d.name for d in path.iterdir() if (d / "config.json").is_file())
        named = ", ".join(runs[:3]) + (", ..." if len(runs) > 3 else "")
        hint = f"; it holds run directories ({named}): pass one" if runs else ""
        raise ValueError(
            f"{path} holds no final.safetensors and no checkpoints/*.safetensors{hint}"
        )
    return saved[-1]


def run_config(checkpoint: Path) -> dict[str, Any]:
    """The config.json of the run the checkpoint belongs to (beside it, or one folder up)."""
    for folder in (checkpoint.parent, checkpoint.parent.parent):
        if (folder / "config.json").is_file():
            try:
                config = json.loads((folder / "config.json").read_text())
                return {"env": config["env"], "env_kwargs": config.get("env_kwargs", {})}
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{folder / 'config.json'} names no env: {exc!r}") from None
    raise ValueError(f"no config.json beside {checkpoint} or in its run directory")


def load_policy(checkpoint: Path) -> NumpyPolicy:
    # A file that is not safetensors raises CodecError, a ValueError.
    tensors = decode_weights(checkpoint.read_bytes())
    if tensors and all(k.startswith(NETWORK_PREFIXES) for k in tensors):
        return numpy_policy(tensors)
    for prefix in ACTING_PREFIXES:
        acting = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        if acting:
            return numpy_policy(acting)
    raise ValueError(
        f"{checkpoint} holds no Q-network ({LEARNER}.q.layers.*), policy "
        f"({LEARNER}.actor.layers.*) or acting network alone (layers.*)"
    )


def _make_env(env_id: str, env_kwargs: dict[str, Any], video: Path | None) -> gym.Env:
    # The workers' evaluation env (make_env, not training: whole games, rewards unclipped).
    if video is None:
        return make_env(env_id, env_kwargs, training=False)
    probe = make_env(env_id, env_kwargs, training=False)
    modes = probe.metadata.get("render_modes", [])
    probe.close()
    if "rgb_array" not in modes:
        raise ValueError(f"--video: {env_id} has no rgb_array render mode (it has {modes})")
    try:
        import moviepy  # noqa: F401  (RecordVideo writes MP4 through it)
    except ImportError:
        raise ValueError("--video needs moviepy: pip install 'clusterenv[video]'") from None
    # The render mode goes to the env under the wrappers; RecordVideo records its frames.
    env = make_env(env_id, env_kwargs, training=False, render_mode="rgb_array")
    return gym.wrappers.RecordVideo(
        env, str(video), episode_trigger=lambda _: True, name_prefix=env_id.replace("/", "_")
    )


def greedy_episodes(
    path: Path, episodes: int, seed: int, video: Path | None = None
) -> tuple[np.ndarray, str, Path]:
    """The greedy returns of `episodes` episodes (seeds `seed`, `seed`+1, ...), the env id and the
    checkpoint file used. ValueError for anything the user can fix."""
    if episodes < 1:
        raise ValueError(f"--episodes must be positive, got {episodes}")
    checkpoint = find_checkpoint(path)
    policy = load_policy(checkpoint)
    config = run_config(checkpoint)
    env_id = config["env"]
    try:
        env = _make_env(env_id, config["env_kwargs"], video)
    except (gym.error.Error, TypeError) as exc:  # TypeError: env_kwargs the env does not take
        raise ValueError(f"env {env_id!r} from the run's config.json: {exc}") from None
    obs_shape = env.observation_space.shape or (0,)
    try:
        outputs = action_spec(env.action_space).outputs
    except ValueError:
        outputs = -1  # a space no agent here trains on: nothing fits it
    if not policy.takes(obs_shape) or outputs != policy.num_outputs:
        env.close()
        raise ValueError(
            f"{checkpoint}: a network of input {policy.input_shape} and {policy.num_outputs} "
            f"outputs does not fit {env_id} ({env.observation_space}, {env.action_space})"
        )
    envs = gym.vector.SyncVectorEnv([lambda: env])
    try:
        returns = np.concatenate(
            [greedy_returns(envs, policy, [seed + i]) for i in range(episodes)]
        )
    except gym.error.DependencyNotInstalled as exc:  # pygame, for the frames of --video
        raise ValueError(f"--video: {exc}") from None
    finally:
        envs.close()  # RecordVideo writes the last episode's file on close
    return returns, env_id, checkpoint


def evaluate_checkpoint(path: Path, episodes: int, seed: int, video: Path | None) -> str:
    """Run the episodes; the line to print. ValueError for anything the user can fix."""
    returns, env_id, checkpoint = greedy_episodes(path, episodes, seed, video)
    line = (
        f"{env_id}: greedy return {returns.mean():.1f} ± {returns.std():.1f} over {episodes} "
        f"episodes (seeds {seed}..{seed + episodes - 1}) of {checkpoint}"
    )
    return line + (f"; videos in {video}" if video is not None else "")
