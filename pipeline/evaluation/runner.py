"""Worker side of evaluation: greedy episodes of a published weight version, result to the learner.

The eval envs are apart from the collection envs (their own instances and seeds) and are kept
between requests of the same shape. The result (JSON: the returns, the version actually
evaluated) goes onto the run's eval-results list, where the learner picks it up.
"""

from __future__ import annotations

import json
import os
from typing import Any

import gymnasium as gym
import numpy as np
import redis

from clusterenv.pipeline.chunks.actor import make_vector_env
from clusterenv.pipeline.evaluation.request import EvalRequest
from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RunKeys
from clusterenv.pipeline.policy import NumpyPolicy, load_policy
from clusterenv.pipeline.spaces import action_spec
from clusterenv.pipeline.sync.client import read_weights


def greedy_returns(envs: gym.vector.VectorEnv, policy: NumpyPolicy, seeds: list[int]) -> np.ndarray:
    """Undiscounted return of one greedy episode in each env, env i reset with `seeds[i]`; the
    greedy action is the action space's (pipeline/spaces.py: argmax for Discrete)."""
    greedy = action_spec(envs.single_action_space).greedy
    obs, _ = envs.reset(seed=seeds)
    returns = np.zeros(envs.num_envs)
    running = np.ones(envs.num_envs, dtype=bool)
    while running.any():
        obs, reward, terminated, truncated, _ = envs.step(greedy(policy(obs)))
        returns += np.where(running, reward, 0.0)
        running &= ~(terminated | truncated)
    return returns


class EvalRunner:
    """Per-process: eval envs by (env id, kwargs, count), weights fetched per request.
    `hostname` is the worker's name in the registry (its heartbeat key), noted against each part
    it takes; "hostname:pid" names this process in the results."""

    def __init__(self, client: redis.Redis, hostname: str):
        self.client, self.hostname = client, hostname
        self.worker_name = f"{hostname}:{os.getpid()}"
        self._envs: tuple[str, gym.vector.VectorEnv] | None = None

    def _vector_env(self, req: EvalRequest) -> gym.vector.VectorEnv:
        shape = json.dumps([req.env_id, req.env_kwargs, len(req.seeds)], sort_keys=True)
        if self._envs is None or self._envs[0] != shape:
            if self._envs is not None:
                self._envs[1].close()
            self._envs = (
                shape,
                make_vector_env(req.env_id, req.env_kwargs, len(req.seeds), training=False),
            )
        return self._envs[1]

    def run(self, req: EvalRequest) -> dict[str, Any]:
        keys = RunKeys(req.run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(keys.stop)
        pipe.hset(keys.eval_takers, f"{req.eval_id}:{req.part}", self.hostname)
        pipe.expire(keys.eval_takers, RUN_KEYS_TTL_S)
        if pipe.execute()[0]:
            return {"eval": req.eval_id, "part": req.part, "skipped": "run stopped"}
        # Retention dropped the version meanwhile: evaluate the newest, and say which.
        found = read_weights(self.client, keys, req.version)
        version = found[0] if found is not None else -1
        result: dict[str, Any] = {"error": f"no weights for version {req.version}"}
        if found is not None:
            try:
                policy = load_policy(found[1])
                returns = greedy_returns(self._vector_env(req), policy, req.seeds)
                result = {"returns": [float(r) for r in returns]}
            except ValueError as exc:  # the learner hears why, instead of waiting for a result
                result = {"error": f"weights version {version} rejected: {exc}"}
        result |= {"eval": req.eval_id, "part": req.part, "version": version,
                   "worker": self.worker_name}  # fmt: skip
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(keys.eval_results, json.dumps(result))
        pipe.expire(keys.eval_results, RUN_KEYS_TTL_S)  # read within seconds, or never
        pipe.execute()
        return result
