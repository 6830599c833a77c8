"""Worker-side actor: a vector env kept alive across chunks, stepped into valid transitions.

Gymnasium 1.x vector envs autoreset in NEXT_STEP mode: the step after an episode ends returns the
reset observation and ignores the action. That step is not a transition and is dropped here;
the done step itself carries the true final observation as `next_obs`. So one env's rows of a
chunk (`env_index`, in time order) are consecutive steps, and an episode boundary falls exactly
after a row with `terminated` or `truncated`: a trajectory reader (PPO's GAE) needs nothing else.
An env whose observations are stacks of frames sends each frame once (pipeline/frames.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from clusterenv.pipeline.envs import make_env
from clusterenv.pipeline.envs.faults import (
    EnvFault,
    NameFaults,
    TimeLimitHit,
    describe,
    hang_fault,
    time_limit,
)
from clusterenv.pipeline.frames import FRAMES, NEXT_FRAMES, OBS_FRAMES, FrameEncoder
from clusterenv.pipeline.spaces import SpaceSpecs, stack_depth

# An action function: actions for a batch of observations, and per-step arrays to keep with them
# (the behaviour log-probs of a sampled policy; nothing for ε-greedy).
Act = Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]]

# Evaluation episodes are seeded from here up (eval_seeds), collection envs below it, so the two
# never share a seed for run seeds below 1000.
EVAL_SEED_BASE = 10**9


def env_seeds(run_seed: int, actor_index: int, num_envs: int) -> list[int]:
    """Distinct, reproducible seeds for the envs of one actor of a run."""
    base = run_seed * 1_000_003 + actor_index * num_envs
    return [base + i for i in range(num_envs)]


def eval_seeds(run_seed: int, eval_index: int, episodes: int) -> list[int]:
    """Seeds of the episodes of one evaluation of a run, apart from every collection seed."""
    base = EVAL_SEED_BASE + run_seed * 1_000_003 + eval_index * episodes
    return [base + i for i in range(episodes)]


def make_vector_env(
    env_id: str, env_kwargs: dict[str, Any], num_envs: int, *, training: bool
) -> gym.vector.VectorEnv:
    """SyncVectorEnv of `num_envs` copies made by make_env (collection: `training`; greedy
    evaluation: not); NEXT_STEP autoreset (gymnasium's default). What the envs raise comes out as
    EnvFault: "make" from here, "reset" and "step" from the vector env (pipeline/envs/faults.py)."""
    try:
        return gym.vector.SyncVectorEnv(
            [lambda: NameFaults(make_env(env_id, env_kwargs, training=training))] * num_envs,
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
    except Exception as exc:
        raise EnvFault("make", describe(exc)) from exc


@dataclass
class Chunk:
    """Transitions of one chunk (time-major, then env) and the episodes it finished."""

    arrays: dict[str, np.ndarray]
    episodes: list[tuple[float, int]] = field(default_factory=list)
    env_steps: int = 0
    fault: EnvFault | None = None  # the env failed: the chunk holds the steps before it
    preempted: bool = False  # the worker is shutting down: the chunk ended early, whole


class Actor:
    """Steps a vector env with a given action function; episodes continue across chunks. Its
    buffers hold observations and actions as the env's spaces say (`spaces`)."""

    def __init__(self, envs: gym.vector.VectorEnv, seeds: list[int]):
        self.envs = envs
        self.num_envs = envs.num_envs
        # Stacked frames (Atari's FrameStackObservation) travel once each: pipeline/frames.py.
        stack = stack_depth(envs.envs[0]) if isinstance(envs, gym.vector.SyncVectorEnv) else 0
        self.spaces = SpaceSpecs.of(envs.single_observation_space, envs.single_action_space, stack)
        self.obs, _ = envs.reset(seed=seeds)
        self._autoreset = np.zeros(self.num_envs, dtype=bool)
        self._ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self._ep_length = np.zeros(self.num_envs, dtype=np.int64)

    def collect(
        self,
        act: Act,
        steps: int,
        time_limit_s: float = 0.0,
        stop: Callable[[], bool] = lambda: False,
    ) -> Chunk:
        """`steps` steps of every env, or fewer once `stop()` says so (looked at before each
        step: the chunk is then `preempted`, its steps whole). If an env raises (EnvFault) or the
        chunk runs past `time_limit_s` (0: no limit), the chunk ends there with the steps
        completed before it and the fault; the envs are then in no known state and this actor
        must be closed."""
        n, obs_spec, act_spec = self.num_envs, self.spaces.obs, self.spaces.action.array
        # Whole observations, or (stacked frames) the indexes of their frames in `frames`.
        encoder = FrameEncoder(self.obs) if self.spaces.stack else None
        row = (self.spaces.stack,) if encoder else obs_spec.row_shape
        obs_buf = np.empty((steps, n, *row), dtype=np.int32 if encoder else obs_spec.dtype)
        next_buf = np.empty_like(obs_buf)
        act_buf = np.empty((steps, n, *act_spec.row_shape), dtype=act_spec.dtype)
        rew_buf = np.empty((steps, n), dtype=np.float32)
        term_buf = np.empty((steps, n), dtype=bool)
        trunc_buf = np.empty((steps, n), dtype=bool)
        valid = np.empty((steps, n), dtype=bool)
        extra_bufs: dict[str, np.ndarray] = {}
        episodes: list[tuple[float, int]] = []
        obs, kept, kept_episodes, fault, preempted = self.obs, 0, 0, None, False
        with time_limit(time_limit_s):
            try:
                for t in range(steps):
                    if stop():
                        preempted = True
                        break
                    actions, extra = act(obs)
                    for name, values in extra.items():
                        if name not in extra_bufs:
                            extra_bufs[name] = np.empty((steps, *values.shape), values.dtype)
                        extra_bufs[name][t] = values
                    next_obs, reward, terminated, truncated, _ = self.envs.step(actions)
                    real = ~self._autoreset  # False on the reset step that follows a done
                    if encoder is None:
                        obs_buf[t], next_buf[t] = obs, next_obs
                    else:
                        obs_buf[t], next_buf[t] = encoder.current(), encoder.advance(next_obs)
                    act_buf[t] = actions
                    rew_buf[t], term_buf[t], trunc_buf[t] = reward, terminated, truncated
                    valid[t] = real
                    self._ep_return += np.where(real, reward, 0.0)
                    self._ep_length += real
                    done = real & (terminated | truncated)
                    for i in np.flatnonzero(done):
                        episodes.append((float(self._ep_return[i]), int(self._ep_length[i])))
                    self._ep_return[done] = 0.0
                    self._ep_length[done] = 0
                    self._autoreset = terminated | truncated
                    obs = next_obs
                    kept, kept_episodes = t + 1, len(episodes)
            except EnvFault as exc:
                fault = exc
            except TimeLimitHit:
                fault = hang_fault(time_limit_s)
        # The trap: a fault can strike anywhere in a step (the time limit's even between two
        # buffer writes); only the steps before it are whole, and only they are sent.
        del episodes[kept_episodes:]
        self.obs = obs
        env_index = np.broadcast_to(np.arange(n, dtype=np.int32), (kept, n))
        flat = valid[:kept].reshape(-1)

        def rows(buf: np.ndarray) -> np.ndarray:
            return buf[:kept].reshape(kept * n, *buf.shape[2:])[flat]

        names = (OBS_FRAMES, NEXT_FRAMES) if encoder else ("obs", "next_obs")
        arrays = {
            names[0]: rows(obs_buf),
            "action": rows(act_buf),
            "reward": rows(rew_buf),
            names[1]: rows(next_buf),
            "terminated": rows(term_buf),
            "truncated": rows(trunc_buf),
            "env_index": rows(env_index),
            **{name: rows(buf) for name, buf in extra_bufs.items()},
        }
        if encoder is not None:
            frame = self.spaces.frame
            arrays[FRAMES] = encoder.array(frame.row_shape, np.dtype(frame.dtype))
        return Chunk(arrays, episodes, kept * n, fault, preempted)

    def close(self) -> None:
        self.envs.close()
