"""Worker side of evaluation: greedy episodes of a published weight version, result to the learner.

The eval envs are apart from the collection envs (their own instances and seeds) and are kept
between requests of the same shape. The result (JSON: the returns, the version actually
evaluated) goes onto the run's eval-results list, where the learner picks it up.
An env that raises (pipeline/envs/faults.py) is built anew and the episodes it had not finished
are played again, until EVAL_ATTEMPTS tries in a row finish none; one that hangs past the
request's time limit is cut off. Either way the learner gets an answer at once (the returns, or
an error naming the fault), not after --eval-timeout-s.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import gymnasium as gym
import numpy as np
import redis

from clusterenv.pipeline.chunks.actor import make_vector_env
from clusterenv.pipeline.envs.faults import EnvFault, TimeLimitHit, hang_fault, time_limit
from clusterenv.pipeline.evaluation.request import EvalRequest
from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RunKeys
from clusterenv.pipeline.policy import NumpyPolicy, load_policy
from clusterenv.pipeline.spaces import action_spec
from clusterenv.pipeline.sync.client import read_weights

log = logging.getLogger(__name__)
EVAL_ATTEMPTS = 3  # tries in a row that finish no episode before a part gives up


def greedy_returns(
    envs: gym.vector.VectorEnv,
    policy: NumpyPolicy,
    seeds: list[int],
    finished: dict[int, float] | None = None,
) -> np.ndarray:
    """Undiscounted return of one greedy episode in each env, env i reset with `seeds[i]`; the
    greedy action is the action space's (pipeline/spaces.py: argmax for Discrete). Each episode's
    return goes into `finished` (by env index) as it ends, so a caller whose env then fails keeps
    the episodes already played."""
    greedy = action_spec(envs.single_action_space).greedy
    finished = {} if finished is None else finished
    obs, _ = envs.reset(seed=seeds)
    returns = np.zeros(envs.num_envs)
    running = np.ones(envs.num_envs, dtype=bool)
    while running.any():
        obs, reward, terminated, truncated, _ = envs.step(greedy(policy(obs)))
        returns += np.where(running, reward, 0.0)
        ended = running & (terminated | truncated)
        finished.update((int(i), float(returns[i])) for i in np.flatnonzero(ended))
        running &= ~ended
    return returns


class EvalRunner:
    """Per-process: eval envs by (env id, kwargs, count), weights fetched per request.
    `hostname` is the worker's name in the registry (its heartbeat key), noted against each part
    it takes; "hostname:pid" names this process in the results."""

    def __init__(self, client: redis.Redis, hostname: str):
        self.client, self.hostname = client, hostname
        self.worker_name = f"{hostname}:{os.getpid()}"
        self._envs: tuple[str, gym.vector.VectorEnv] | None = None

    def _close_envs(self) -> None:
        envs, self._envs = self._envs, None
        if envs is not None:
            try:
                envs[1].close()
            except Exception as exc:  # the user's env; new ones are built either way
                log.warning("closing the eval envs failed: %s: %s", type(exc).__name__, exc)

    def _returns(self, req: EvalRequest, policy: NumpyPolicy) -> dict[str, Any]:
        """{"returns": [...]} of the part's episodes, or {"error", "env_error"} naming the
        fault that ended it. An env that raises is built anew and the episodes not yet played
        are run again, until EVAL_ATTEMPTS tries in a row finish none; the part's time limit
        covers all its tries."""
        done: dict[int, float] = {}  # seed index -> return
        fruitless = 0
        try:
            with time_limit(req.time_limit_s):
                while True:
                    todo = [i for i in range(len(req.seeds)) if i not in done]
                    finished: dict[int, float] = {}
                    try:
                        greedy_returns(self._vector_env(req, len(todo)), policy,
                                       [req.seeds[i] for i in todo], finished)  # fmt: skip
                        done |= {todo[j]: r for j, r in finished.items()}
                        return {"returns": [done[i] for i in range(len(req.seeds))]}
                    except EnvFault as exc:
                        done |= {todo[j]: r for j, r in finished.items()}
                        fruitless = 0 if finished else fruitless + 1
                        self._warn(req, exc, f"{len(done)} of {len(req.seeds)} episodes played")
                        self._close_envs()
                        if fruitless >= EVAL_ATTEMPTS:
                            return self._failed(exc)
        except TimeLimitHit:
            fault = hang_fault(req.time_limit_s)
            self._warn(req, fault, f"{len(done)} of {len(req.seeds)} episodes played")
            self._close_envs()
            return self._failed(fault)

    @staticmethod
    def _failed(fault: EnvFault) -> dict[str, Any]:
        return {"error": f"env fault in {fault.kind}: {fault.error}", "env_error": fault.report()}

    @staticmethod
    def _warn(req: EvalRequest, fault: EnvFault, progress: str) -> None:
        log.warning("evaluation %d part %d of %s: env fault in %s: %s (%s)", req.eval_id,
                    req.part, req.run_id, fault.kind, fault.error, progress)  # fmt: skip

    def _vector_env(self, req: EvalRequest, count: int) -> gym.vector.VectorEnv:
        shape = json.dumps([req.env_id, req.env_kwargs, count], sort_keys=True)
        if self._envs is None or self._envs[0] != shape:
            self._close_envs()
            self._envs = (
                shape,
                make_vector_env(req.env_id, req.env_kwargs, count, training=False),
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
                result = self._returns(req, load_policy(found[1]))
            except ValueError as exc:  # the learner hears why, instead of waiting for a result
                result = {"error": f"weights version {version} rejected: {exc}"}
        result |= {"eval": req.eval_id, "part": req.part, "version": version,
                   "worker": self.worker_name}  # fmt: skip
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(keys.eval_results, json.dumps(result))
        pipe.expire(keys.eval_results, RUN_KEYS_TTL_S)  # read within seconds, or never
        pipe.execute()
        return result
